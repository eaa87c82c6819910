"""The reference's ``transformers.utils.notebook`` path: the notebook progress display, owned by
``trainwell.events.notebook`` (docs/compat.md)."""

from trainwell.events.notebook import (
    NotebookProgressBar,
    NotebookProgressCallback,
    NotebookTrainingTracker,
    format_time,
    html_progress_bar,
    text_to_html_table,
)

__all__ = ["NotebookProgressBar", "NotebookProgressCallback", "NotebookTrainingTracker", "format_time",
           "html_progress_bar", "text_to_html_table"]
