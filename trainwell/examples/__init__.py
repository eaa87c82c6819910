"""Small, self-contained examples that ship with trainwell (used by ``trainwell demo``).

Owns: the byte-level causal transformer (``bytelm``) and its corpus, the Python standard library's own
``.py`` sources (``stdlib_text``). Both need torch only: no tokenizer, no download.
"""
