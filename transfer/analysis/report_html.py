"""The report's HTML page: one jinja2 template, self-contained (CSS inline, PNGs as base64), so
it opens offline as one file. The template lives here to ship without package data; autoescaping
is on (titles, cells and notes are text, never markup).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import jinja2

from transfer.analysis.report_sections import Section

__all__ = ["render_html"]

_TEMPLATE = """\
<!DOCTYPE html>
<html><head><meta charset='utf-8'><title>{{ title }}</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2em; border-bottom: 1px solid #aaa; }
table { border-collapse: collapse; margin: 0.5em 0 0.3em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th:first-child, td:first-child, td:nth-child(2) { text-align: left; }
th { background: #eee; } tr.ours td { background: #e6f2ff; font-weight: bold; }
tr.missing td { color: #999; font-style: italic; }
.note { color: #555; font-size: 12px; margin: 0.2em 0 1em; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figure img { width: 600px; border: 1px solid #ddd; }
figcaption { font-size: 12px; color: #444; }
.tablewrap { overflow-x: auto; }
</style></head><body><h1>{{ title }}</h1>
<p>Generated {{ stamp }}.</p>
<ul>
{%- for item in inputs %}
<li>{{ item }}</li>
{%- endfor %}
</ul>
<ul>
{%- for sec in sections %}
<li><a href='#s{{ loop.index0 }}'>{{ sec.title }}</a></li>
{%- endfor %}
</ul>
{%- for sec in sections %}
<h2 id='s{{ loop.index0 }}'>{{ sec.title }}</h2>
{%- for p in sec.text %}
<p>{{ p }}</p>
{%- endfor %}
{%- for fig in sec.figures %}
<figure><img alt='{{ fig.title }}' src='data:image/png;base64,{{ png(fig.path) }}'>
<figcaption>{{ fig.title }} ({{ fig.caption }})</figcaption></figure>
{%- endfor %}
{%- for t in sec.tables %}
<h3>{{ t.title }}</h3><div class='tablewrap'><table>
<tr>{% for c in t.columns %}<th>{{ c }}</th>{% endfor %}</tr>
{%- for cells, kind in zip(t.rows, t.kinds) %}
<tr class='{{ kind }}'>{% for c in cells %}<td>{{ c }}</td>{% endfor %}</tr>
{%- endfor %}
</table></div>
{%- for note in t.notes %}
<p class='note'>{{ note }}</p>
{%- endfor %}
{%- endfor %}
{%- endfor %}
</body></html>
"""


def _png_base64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode("ascii")


_ENV = jinja2.Environment(
    autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True
)
_PAGE = _ENV.from_string(_TEMPLATE)


def render_html(title: str, stamp: str, inputs: Sequence[str], sections: Sequence[Section]) -> str:
    """The page of :func:`transfer.analysis.report.build_report`, figures embedded."""
    return _PAGE.render(
        title=title, stamp=stamp, inputs=inputs, sections=sections, png=_png_base64, zip=zip
    )
