"""mkdocs hook: drop Sphinx roles (``:func:``, ``:class:`` ...) the docstrings use before code spans."""

import re

_ROLE = re.compile(r":(?:func|class|data|mod|meth|attr|obj):(?=<code>)")


def on_page_content(html, **kwargs):
    return _ROLE.sub("", html)
