"""The text a mail client shows of an HTML reply, up to its quote (`visible_text`): what a
reviewer cannot see must not decide.

Left out: comments; the elements that are never shown (`head`, `title`, `style`, `script`,
`template`, `noscript`, `iframe`, `select`, `svg`, closed `details`, ...); every element with
the `hidden` attribute, or an inline `style` or a `<style>` rule (by tag, class, id or
attribute, in `@media` and the like too) that hides it: `display: none`, `visibility:
hidden`, `opacity` under 0.1, a `font-size` too small to read (0 in any unit, under 3px),
`height` or `width` 0 with `overflow` hidden, `color: transparent`, Outlook's `mso-hide:
all`; and everything inside those. `aria-hidden` hides from screen readers only, so it counts
as shown. Reading stops at the first quote container (`blockquote`, Gmail's `gmail_quote`,
Outlook's `divRplyFwdMsg`, Thunderbird's `moz-cite-prefix`) that is shown, or once `limit`
characters were read.

Why not `html.parser`: it is not the parser a mail client has, and it changes between patch
releases. On an unterminated comment, tag or quote it goes quadratic (minutes for one 1 MB
message, measured on Python 3.11.7); it closes a comment at `-- >` where a browser reads on
to `-->`, ends `<title>` at `</ title>`, and parses tags inside `<textarea>` and `<iframe>`.
The tokenizer here follows the HTML standard's where visibility depends on it, in one linear
pass, and keeps every attribute (a browser takes the first of two `style` attributes; both
are judged here).

The tree is not built as a browser builds it (that algorithm is long); where the two can
differ, this reader hides more, never less: an element that hides is closed by its own end
tag only when nothing but implied-end elements (`p`, `li`, ...) is open inside it; an end tag
never closes past an element that hides, a scope boundary (`table`, `td`, `template`, ...)
or more than `_REACH` elements; `</body>` and `</html>` close nothing; an element left open
hides the rest; a second `<body>` or `<html>` that hides hides everything (a browser merges
it into the first); a `<script>` holding `<!--` runs to the end; a `<style>` selector this
reader cannot judge matches every element, and more than `MAX_RULES` hiding selectors hide
everything. Reading is linear in the message's size (about a second for the worst message of
`limits.EMAIL_BODY`, a few milliseconds for a real reply).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from html import unescape

__all__ = ["MAX_RULES", "visible_text"]

MAX_RULES = 64
"""The most `<style>` selectors that hide, beyond which the whole message counts as hidden
(matching costs each element a look at them)."""

# --- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Start:
    name: str
    attributes: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class _End:
    name: str


_Token = str | _Start | _End
"""Text (character references decoded), a start tag or an end tag."""
_Tokens = Generator[_Token, None, int]
"""Yields tokens; returns where they end."""

_NAME = re.compile(r"[^\t\n\f\r />]*")
_BETWEEN = re.compile(r"[\t\n\f\r /]*")
_ATTRIBUTE_NAME = re.compile(r"[^\t\n\f\r />][^\t\n\f\r /=>]*")
_VALUE = re.compile(r"""[\t\n\f\r ]*=[\t\n\f\r ]*(?:"([^"]*)(")?|'([^']*)(')?|([^\t\n\f\r >]*))""")
_COMMENT_END = re.compile(r"--!?>")
_RAW = {"style", "script", "xmp", "iframe", "noembed", "noframes", "title", "textarea"}
"""Elements whose content is text up to their end tag (RAWTEXT, RCDATA, script data)."""
_ESCAPABLE = {"title", "textarea"}


def _tokens(html: str) -> Iterator[_Token]:
    """The tokens of `html`; a tag, comment or quoted value left unterminated ends it."""
    at, end = 0, len(html)
    while at < end:
        lt = html.find("<", at)
        if lt < 0:
            yield unescape(html[at:])
            return
        if lt > at:
            yield unescape(html[at:lt])
        at, after = lt, html[lt + 1 : lt + 2]
        if html.startswith("<!--", at):
            at = _comment_end(html, at + 4)
        elif after in ("!", "?"):
            at = _bogus_comment_end(html, at + 2)
        elif after == "/":
            at = yield from _end_tag(html, at + 2)
        elif after.isascii() and after.isalpha():
            at = yield from _start_tag(html, at + 1)
        else:
            yield "<"
            at += 1


def _comment_end(html: str, at: int) -> int:
    """Where the comment whose text starts at `at` ends (`-->`, `--!>`, or `<!-->` and
    `<!--->` at once); the end of `html` when it does not."""
    for abrupt in (">", "->"):
        if html.startswith(abrupt, at):
            return at + len(abrupt)
    found = _COMMENT_END.search(html, at)
    return len(html) if found is None else found.end()


def _bogus_comment_end(html: str, at: int) -> int:
    close = html.find(">", at)
    return len(html) if close < 0 else close + 1


def _end_tag(html: str, at: int) -> _Tokens:
    """The end tag after `</` at `at`: yields it; returns where it ends."""
    first = html[at : at + 1]
    if not first:
        yield "</"
        return at
    if first == ">":
        return at + 1
    if not (first.isascii() and first.isalpha()):
        return _bogus_comment_end(html, at)
    name = _NAME.match(html, at)
    assert name is not None
    _, done = _attributes(html, name.end())
    if done is not None:
        yield _End(name.group().lower())
        return done
    return len(html)


def _start_tag(html: str, at: int) -> _Tokens:
    """The start tag whose name starts at `at` and, for a raw text element, its text:
    yields them; returns where they end."""
    found = _NAME.match(html, at)
    assert found is not None
    name = found.group().lower()
    attributes, done = _attributes(html, found.end())
    if done is None:
        return len(html)  # a tag cut off by the end is no tag
    yield _Start(name, attributes)
    if name == "plaintext":
        yield html[done:]
        return len(html)
    if name in _RAW:
        stop = _raw_end(name).search(html, done)
        until = len(html) if stop is None else stop.start()
        if name == "script" and html.find("<!--", done, until) >= 0:
            # Past a "<!--", where a script ends depends on escape states that no reply
            # needs: it runs to the end (more is hidden, never less).
            until = len(html)
        text = html[done:until]
        yield unescape(text) if name in _ESCAPABLE else text
        return until
    return done


@functools.cache
def _raw_end(name: str) -> re.Pattern[str]:
    """The end tag of the raw text element `name`: `</name` and a space, `/` or `>`."""
    return re.compile(rf"</{re.escape(name)}(?=[\t\n\f\r />])", re.IGNORECASE)


def _attributes(html: str, at: int) -> tuple[tuple[tuple[str, str], ...], int | None]:
    """The attributes of the tag whose name ends at `at` (names lowercased, every one kept:
    a browser keeps the first of two with one name), and where the tag ends; None when the
    message ends inside it."""
    found: list[tuple[str, str]] = []
    end = len(html)
    while True:
        skipped = _BETWEEN.match(html, at)
        assert skipped is not None  # it matches the empty string too
        at = skipped.end()
        if at >= end:
            return tuple(found), None
        if html[at] == ">":
            return tuple(found), at + 1
        name = _ATTRIBUTE_NAME.match(html, at)
        assert name is not None
        at = name.end()
        value = _VALUE.match(html, at)
        if value is None:
            found.append((name.group().lower(), ""))
            continue
        double, closed_double, single, closed_single, bare = value.groups()
        if (double is not None and closed_double is None) or (
            single is not None and closed_single is None
        ):
            return tuple(found), None
        text = double if double is not None else single if single is not None else bare
        found.append((name.group().lower(), unescape(text or "")))
        at = value.end()


# --- CSS ----------------------------------------------------------------------------------------

_CSS_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)", re.DOTALL)
_CSS_ESCAPE = re.compile(r"\\(?:([0-9a-fA-F]{1,6})[\t\n\f\r ]?|(.))", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")
_SIZE = re.compile(r"(?:^|\s)([-+]?(?:\d+\.?\d*|\.\d+)[a-z%]*)(?=/|\s|$)")
_TINY = {"": 3.0, "px": 3.0, "pt": 2.25, "em": 0.2, "rem": 0.2, "ex": 0.4, "ch": 0.4, "%": 20.0}
"""Font sizes under these are too small to read (in other units, only 0 is)."""
_BOXES = ("height", "max-height", "width", "max-width")
_OVERFLOWS = ("overflow", "overflow-x", "overflow-y")
_COLOR_FUNCTION = re.compile(r"^(?:rgba?|hsla?|hwb|lab|lch|oklab|oklch)\((.*)\)$")


def _css_text(text: str) -> str:
    """`text` without comments and escapes, lowercased (what matters here is case-blind)."""
    text = _CSS_COMMENT.sub(" ", text)
    return _CSS_ESCAPE.sub(_unescaped, text).lower()


def _unescaped(found: re.Match[str]) -> str:
    if found.group(2) is not None:
        return "" if found.group(2) == "\n" else found.group(2)
    code = int(found.group(1), 16)
    return chr(code) if 0 < code <= 0x10FFFF else "\ufffd"


def _declarations(block: str) -> dict[str, list[str]]:
    """Property name to every value it is given in a declaration block (`_css_text`'s),
    without `!important`."""
    found: dict[str, list[str]] = {}
    for declaration in block.split(";"):
        name, colon, value = declaration.partition(":")
        if colon:
            found.setdefault(name.strip(), []).append(value.replace("!important", " ").strip())
    return found


def _hides(block: str) -> bool:
    """Whether a declaration block (`_css_text`'s) hides what it styles. Every declaration
    counts, whichever comes last: more is hidden, never less."""
    found = _declarations(block)

    def first_words(name: str) -> set[str]:
        return {value.split()[0] for value in found.get(name, ()) if value.split()}

    if "none" in first_words("display") or first_words("visibility") & {"hidden", "collapse"}:
        return True
    if "all" in first_words("mso-hide") or any(map(_transparent, found.get("color", ()))):
        return True
    if any(_amount(value, percent_of=100.0) < 0.1 for value in found.get("opacity", ())):
        return True
    sizes = [
        *found.get("font-size", ()),
        *(size for font in found.get("font", ()) for size in _SIZE.findall(font)),
    ]
    if any(map(_tiny, sizes)):
        return True
    clipped = {
        word for name in _OVERFLOWS for value in found.get(name, ()) for word in value.split()
    }
    zero = any(_amount(value) <= 0 for name in _BOXES for value in found.get(name, ()))
    return zero and bool(clipped & {"hidden", "clip"})


def _amount(value: str, *, percent_of: float = 1.0) -> float:
    """The number `value` starts with (a percentage divided by `percent_of`); infinity
    when it starts with none."""
    number = _NUMBER.match(value.strip())
    if number is None:
        return float("inf")
    amount = float(number.group())
    return amount / percent_of if value.strip()[number.end() :].startswith("%") else amount


def _tiny(size: str) -> bool:
    """Whether a font size is too small to read (see `_TINY`)."""
    number = _NUMBER.match(size.strip())
    if number is None:
        return False
    amount, unit = float(number.group()), size.strip()[number.end() :]
    return amount <= 0 or amount < _TINY.get(unit, 0.0)


def _transparent(color: str) -> bool:
    """Whether a color value is fully transparent."""
    if color == "transparent" or re.fullmatch(r"#[0-9a-f]{3}0|#[0-9a-f]{6}00", color):
        return True
    function = _COLOR_FUNCTION.match(color)
    if function is None:
        return False
    arguments = function.group(1)
    if "/" in arguments:
        alpha = arguments.rpartition("/")[2]
    else:
        parts = arguments.split(",")
        if len(parts) != 4:
            return False
        alpha = parts[3]
    return _amount(alpha, percent_of=100.0) <= 0


# --- <style> rules ------------------------------------------------------------------------------

_CSS_TOKEN = re.compile(r""""(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|\\.|[{}]""", re.DOTALL)
_NESTING = ("@media", "@supports", "@document", "@-moz-document", "@layer", "@container", "@scope")
_PSEUDO = re.compile(r"::?[a-z-]+(?:\([^()]*\))?")
_ATTRIBUTE_SELECTOR = re.compile(r"\[\s*([^\s~|^$*=\]]+)[^\]]*\]")
_COMPOUND = re.compile(r"^(\*|[a-z][\w-]*)?((?:[#.][\w-]+)*)$")


@dataclass(frozen=True)
class _Selector:
    """What an element must have to match the last compound of a selector (the combinators
    before it are not judged: it matches more elements, never fewer)."""

    tag: str | None = None
    ids: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    attributes: frozenset[str] = frozenset()

    def matches(self, element: _Element) -> bool:
        return (
            (self.tag is None or self.tag == element.name)
            and self.ids <= element.ids
            and self.classes <= element.classes
            and self.attributes <= element.attribute_names
        )


@dataclass(frozen=True)
class _Element:
    name: str
    ids: frozenset[str]
    classes: frozenset[str]
    attribute_names: frozenset[str]

    @classmethod
    def of(cls, tag: _Start) -> _Element:
        ids = {value.lower() for name, value in tag.attributes if name == "id"}
        classes = {
            word.lower()
            for name, value in tag.attributes
            if name == "class"
            for word in value.split()
        }
        names = {name for name, _ in tag.attributes}
        return cls(tag.name, frozenset(ids), frozenset(classes), frozenset(names))


def _rule_blocks(css: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    """(prelude, block) of each rule of `css`, the rules inside `@media` and the like too;
    strings and escapes are skipped over when braces are matched."""
    level, start, opened = 0, 0, 0
    for token in _CSS_TOKEN.finditer(css):
        brace = token.group()
        if brace == "{":
            if level == 0:
                opened = token.end()
            level += 1
        elif brace == "}":
            if level == 0:
                start = token.end()  # a stray brace: what follows starts a new rule
                continue
            level -= 1
            if level == 0:
                yield from _rule(css[start : opened - 1], css[opened : token.start()], depth)
                start = token.end()
    if level:
        yield from _rule(css[start : opened - 1], css[opened:], depth)


def _rule(prelude: str, block: str, depth: int) -> Iterator[tuple[str, str]]:
    prelude = prelude.rpartition(";")[2].strip()  # after an `@import ...;` statement
    if not prelude.startswith("@"):
        yield prelude, block
    elif prelude.startswith(_NESTING) and depth < 8:
        yield from _rule_blocks(block, depth + 1)


def _selector(text: str) -> _Selector:
    """The last compound of one selector; one this reader cannot judge matches everything."""
    if "\\" in text:
        return _Selector()
    text = _PSEUDO.sub("", text)
    attributes = frozenset(found.lower() for found in _ATTRIBUTE_SELECTOR.findall(text))
    text = _ATTRIBUTE_SELECTOR.sub("", text)
    last = re.split(r"[\s>+~]+", text.strip())[-1]
    compound = _COMPOUND.match(last)
    if compound is None:
        return _Selector()
    tag = compound.group(1)
    parts = re.findall(r"([#.])([\w-]+)", compound.group(2))
    return _Selector(
        tag=None if tag in (None, "*") else tag,
        ids=frozenset(value for kind, value in parts if kind == "#"),
        classes=frozenset(value for kind, value in parts if kind == "."),
        attributes=attributes,
    )


@dataclass
class _Sheet:
    """The hiding selectors of a message's `<style>` elements, and whether everything is
    hidden (a second `<body>` or `<html>` that hides, or too many selectors)."""

    selectors: list[_Selector] = field(default_factory=list)
    everything: bool = False

    def read(self, css: str) -> None:
        for prelude, block in _rule_blocks(_css_text(css.replace("<!--", " ").replace("-->", " "))):
            if _hides(block):
                self.selectors.extend(_selector(one) for one in prelude.split(","))
        if len(self.selectors) > MAX_RULES:
            self.everything = True

    def hides(self, element: _Element) -> bool:
        return self.everything or any(selector.matches(element) for selector in self.selectors)


def _sheet(html: str) -> _Sheet:
    sheet = _Sheet()
    opened: _Start | None = None
    for token in _tokens(html):
        if isinstance(token, str):
            if opened is not None and opened.name == "style":
                sheet.read(token)
        elif isinstance(token, _Start) and token.name in ("body", "html") and _styled_hidden(token):
            sheet.everything = True
        opened = token if isinstance(token, _Start) else None
    return sheet


# --- reading ------------------------------------------------------------------------------------

_BLOCK = {
    "p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "hr",
    "ul", "ol", "dl", "dt", "dd", "section", "article", "header", "footer", "center",
    "address", "form", "fieldset", "figure", "main", "nav", "aside",
}  # fmt: skip
_NEVER_SHOWN = {
    "head", "title", "style", "script", "template", "noscript", "iframe", "noembed",
    "noframes", "object", "applet", "embed", "select", "datalist", "svg", "math", "audio",
    "video", "canvas", "rp", "frameset",
}  # fmt: skip
_VOID = {
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "image", "img",
    "input", "keygen", "link", "meta", "param", "source", "track", "wbr",
}  # fmt: skip
_SCOPE = {
    "applet", "caption", "html", "table", "td", "th", "marquee", "object", "template", "mi",
    "mo", "mn", "ms", "mtext", "annotation-xml", "foreignobject", "desc", "title", "button",
    "ol", "ul", "select",
}  # fmt: skip
"""End tags do not reach past these (a browser's "in scope"), nor past anything hidden."""
_IMPLIED = {"dd", "dt", "li", "optgroup", "option", "p", "rb", "rp", "rt", "rtc"}
"""Elements an end tag closes without its own end tag (a browser's implied end tags)."""
_REACH = 64
"""How far down the open elements an end tag looks for its own: one deeper closes nothing,
so that each end tag costs the same however many elements were left open."""
_SHOWN_WHEN_OPEN = {"details", "dialog"}
_INLINE = ("inline", "contents", "none", "ruby")
_QUOTE_CLASSES = {"gmail_quote", "gmail_attr", "moz-cite-prefix", "gmail_signature"}
_QUOTE_IDS = {"divrplyfwdmsg", "appendonsend", "mail-editor-reference-message-container"}


def _styled_hidden(tag: _Start) -> bool:
    """Whether a tag's own attributes hide it (`hidden`, or any `style` that hides)."""
    for name, value in tag.attributes:
        if name == "hidden" or (name == "style" and _hides(_css_text(value))):
            return True
    return False


def _breaks(tag: _Start) -> bool:
    """Whether the element starts a new line: a block element, unless its style makes it
    inline; an inline one whose style makes it a block."""
    display = [
        value.partition(":")[2].replace("!important", "").strip()
        for name, style in tag.attributes
        if name == "style"
        for value in _css_text(style).split(";")
        if value.partition(":")[0].strip() == "display"
    ]
    if display and display[-1]:
        return not display[-1].startswith(_INLINE)
    return tag.name in _BLOCK


@dataclass
class _Reader:
    """Reads the tokens, keeping the text of what is shown (see the module)."""

    sheet: _Sheet
    limit: int
    open: list[tuple[str, bool, bool]] = field(default_factory=list)
    """The open elements: name, whether it hides, whether it breaks lines."""
    hiding: int = 0
    pieces: list[str] = field(default_factory=list)
    read: int = 0
    done: bool = False

    def take(self, token: _Token) -> None:
        if isinstance(token, str):
            if not self.hiding:
                text = re.sub(r"[\t\n\f\r ]+", " ", token)
                self.pieces.append(text)
                self.read += len(text) - text.count(" ")
                self.done = self.read > self.limit
        elif isinstance(token, _Start):
            self._start(token)
        else:
            self._end(token.name)

    def _start(self, tag: _Start) -> None:
        hides = (
            self.sheet.everything
            or tag.name in _NEVER_SHOWN
            or (tag.name in _SHOWN_WHEN_OPEN and not any(n == "open" for n, _ in tag.attributes))
            or _styled_hidden(tag)
            or (bool(self.sheet.selectors) and self.sheet.hides(_Element.of(tag)))
        )
        shown = not self.hiding and not hides
        if shown and _quotes(tag):
            self.done = True
            return
        breaks = _breaks(tag)
        if shown and breaks:
            self.pieces.append("\n")
        if tag.name not in _VOID:
            self.open.append((tag.name, hides, breaks))
            self.hiding += hides

    def _end(self, name: str) -> None:
        if name == "br":  # `</br>` is a `<br>` to a browser
            self._start(_Start("br", ()))
            return
        if name in ("body", "html"):
            return  # a browser closes neither: what follows is still inside them
        for index in range(len(self.open) - 1, max(-1, len(self.open) - 1 - _REACH), -1):
            found, hides, breaks = self.open[index]
            if found == name:
                break
            if hides or found in _SCOPE:
                return
        else:
            return  # not open, or too deep to be looked for (see `_REACH`)
        inside = self.open[index + 1 :]
        if hides and any(other not in _IMPLIED for other, _, _ in inside):
            return
        shown = not self.hiding
        self.hiding -= hides
        del self.open[index:]
        if shown and breaks:
            self.pieces.append("\n")

    def text(self) -> str:
        lines = (line.strip() for line in "".join(self.pieces).split("\n"))
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def _quotes(tag: _Start) -> bool:
    """Whether the element is a quote container (the quoted request starts there)."""
    if tag.name == "blockquote":
        return True
    for name, value in tag.attributes:
        if name == "class" and _QUOTE_CLASSES & set(value.lower().split()):
            return True
        if name == "id" and value.lower() in _QUOTE_IDS:
            return True
    return False


def visible_text(html: str, *, limit: int) -> str:
    """The text of `html` a mail client shows above its quote (see the module): block
    elements as line breaks, runs of spaces as one; read until `limit` characters (not
    counting spaces) were, or the quote starts."""
    sheet = _sheet(html) if _needs_sheet(html) else _Sheet()
    if sheet.everything:
        return ""
    reader = _Reader(sheet, limit)
    for token in _tokens(html):
        reader.take(token)
        if reader.done:
            break
    return reader.text()


def _needs_sheet(html: str) -> bool:
    """Whether `html` has what only a first pass can judge: `<style>` elements (their rules
    apply wherever they are) or a `<body>` or `<html>` tag (one that hides hides all)."""
    lowered = html.lower()
    return any(tag in lowered for tag in ("<style", "<body", "<html"))
