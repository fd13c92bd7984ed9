"""Renders the pages' TeX (`$...$`) as MathML when the site is built: browsers draw MathML themselves, so
the formulas need no script from the network and show offline. Code spans and blocks are left alone."""

from __future__ import annotations

import re

from latex2mathml.converter import convert

# code blocks and spans first (kept as they are), then inline TeX: `$x$`, not `$$`, not `\$`
PIECES = re.compile(r"(```.*?```|`[^`\n]*`)|(?<![\\$])\$([^$`\n]+?)\$", re.DOTALL)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return PIECES.sub(lambda match: match.group(1) or convert(match.group(2)), markdown)
