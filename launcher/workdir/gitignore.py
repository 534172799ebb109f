"""Git's ignore rules, read and matched the way git does, without git.

A user's folder need not be a repository and a node need not have git, so launch reads
`.gitignore` files itself. The semantics are git's own (gitignore(5); dir.c and wildmatch.c
of git): a rule list per folder, the last matching rule of the deepest list decides; `!`
re-includes; a trailing `/` matches folders only; a rule with a slash at its start or middle is
anchored to its file's folder, one without matches a name at any depth below it; `*`, `?` and
`[...]` (`!`/`^` negation, ranges, `[:class:]`) never match `/`; `**/`, `/**` and `/**/`
span folders; `\\` escapes (`\\#`, `\\!`, `\\ `); trailing spaces are dropped unless escaped;
CRLF and a UTF-8 BOM are tolerated. Matching is on bytes, as git's is (`?` is one byte), and
takes time linear in the name for a given pattern (Glob: every place in the pattern at once,
never backtracking: a line of `*a*a*a...` against a long name once stalled even --dry-run).
Whether a file inside an excluded folder can come back is the walker's business: git never
looks inside an excluded folder, and neither does launcher/workdir/scan.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# POSIX classes as git's wildmatch tests them (ASCII only, sane_ctype).
_CLASSES = {
    b"alnum": b"0-9A-Za-z", b"alpha": b"A-Za-z", b"blank": b" \t", b"cntrl": b"\x00-\x1f\x7f",
    b"digit": b"0-9", b"graph": b"!-~", b"lower": b"a-z", b"print": b" -~",
    b"punct": b"!-/:-@[-`{-~", b"space": b" \t\n\v\f\r", b"upper": b"A-Z",
    b"xdigit": b"0-9A-Fa-f",
}


# A pattern's pieces (Glob.tokens): one byte, one byte of a set, `*` (a run of bytes but `/`),
# `**` (any run), `**/` (zero or more whole folders).
BYTE, ONE_OF, STAR, ANY, FOLDERS = range(5)


class Glob:
    """A translated pattern, matched as a set of places in it moved forward one byte at a time
    (Thompson's construction): len(tokens) x len(name) steps at most, whatever the pattern.
    A place is 2*i (before token i) or 2*i+1 (inside a FOLDERS token, after a byte that was
    not its closing `/`)."""

    def __init__(self, tokens: list[tuple[int, Any]]):
        self.tokens = tokens

    def _close(self, places: set[int]) -> set[int]:
        out, todo = set(), list(places)
        while todo:
            place = todo.pop()
            if place in out:
                continue
            out.add(place)
            i = place // 2
            if place % 2 == 0 and i < len(self.tokens) and self.tokens[i][0] in (STAR, ANY,
                                                                                  FOLDERS):
                todo.append(2 * (i + 1))   # zero bytes of it
        return out

    def fullmatch(self, text: bytes) -> bool:
        end = 2 * len(self.tokens)
        places = self._close({0})
        for byte in text:
            nxt: set[int] = set()
            for place in places:
                i = place // 2
                if i >= len(self.tokens):
                    continue
                kind, arg = self.tokens[i]
                if kind == BYTE:
                    if byte == arg:
                        nxt.add(2 * (i + 1))
                elif kind == ONE_OF:
                    if arg[byte]:
                        nxt.add(2 * (i + 1))
                elif kind == STAR:
                    if byte != 0x2F:
                        nxt.add(2 * i)
                elif kind == ANY:
                    nxt.add(2 * i)
                else:   # FOLDERS: any bytes, left only right after a `/`
                    nxt.add(2 * i + 1)
                    if byte == 0x2F:
                        nxt.add(2 * (i + 1))
            if not nxt:
                return False
            places = self._close(nxt)
        return end in places


@dataclass(frozen=True)
class Rule:
    """One pattern line. `base` is the folder of its file, relative to where matching starts
    ("" for the top), without a trailing slash."""

    source: str          # the file it came from, as shown to the user
    line: int
    pattern: str         # as written, trailing spaces trimmed (for messages)
    base: bytes
    negative: bool
    dir_only: bool
    basename: bool       # no slash: matched against the last path component
    glob: Glob | None    # None: a malformed pattern, which git never matches

    def matches(self, path: bytes, is_dir: bool) -> bool:
        if self.glob is None or (self.dir_only and not is_dir):
            return False
        if self.basename:
            return self.glob.fullmatch(path.rpartition(b"/")[2])
        if self.base:
            if not path.startswith(self.base + b"/"):
                return False
            path = path[len(self.base) + 1:]
        return self.glob.fullmatch(path)

    def describe(self) -> str:
        return f"{self.source}:{self.line} `{self.pattern}`"


def parse(data: bytes, source: str, base: bytes = b"") -> list[Rule]:
    """The rules of one ignore file's bytes, in file order."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    rules = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line or line.startswith(b"#"):
            continue
        line = _trim_trailing_spaces(line)
        rule = _rule(line, source, number, base)
        if rule is not None:
            rules.append(rule)
    return rules


def _trim_trailing_spaces(line: bytes) -> bytes:
    # git's trim_trailing_spaces(): unescaped trailing spaces go; "\ " keeps its space.
    last_space = None
    i = 0
    while i < len(line):
        ch = line[i:i + 1]
        if ch == b" ":
            if last_space is None:
                last_space = i
        elif ch == b"\\":
            i += 1
            if i >= len(line):
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def _rule(line: bytes, source: str, number: int, base: bytes) -> Rule | None:
    text = line.decode("utf-8", "replace")
    negative = line.startswith(b"!")
    if negative:
        line = line[1:]
    dir_only = line.endswith(b"/")
    if dir_only:
        line = line[:-1]
    if not line:
        return None   # "", "!" or "/": git matches nothing with them
    basename = b"/" not in line
    if line.startswith(b"/"):
        line = line[1:]
    if basename:
        tokens = _translate(line)
    else:
        # As git's match_pathname(): the part before the first wildcard is compared as it
        # is and wildmatch gets the rest as a pattern of its own, so a `**` right after that
        # part counts as leading (`a**/x` matches `a/x` and `ab/c/x`, as git's does).
        cut = next((i for i, c in enumerate(line) if c in b"*?[\\"), len(line))
        rest = _translate(line[cut:])
        tokens = None if rest is None else [(BYTE, b) for b in line[:cut]] + rest
    return Rule(source=source, line=number, pattern=text, base=base, negative=negative,
                dir_only=dir_only, basename=basename,
                glob=None if tokens is None else Glob(tokens))


def _translate(pattern: bytes) -> list[tuple[int, Any]] | None:
    """wildmatch(pattern, WM_PATHNAME) as Glob tokens; None where wildmatch aborts (an
    unterminated `[`, an unknown `[:class:]`, a trailing backslash)."""
    out: list[tuple[int, Any]] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i:i + 1]
        if ch == b"*":
            j = i
            while j < n and pattern[j:j + 1] == b"*":
                j += 1
            after = pattern[j:j + 1]
            bounded = (j - i >= 2 and (i == 0 or pattern[i - 1:i] == b"/")
                       and (after in (b"", b"/") or pattern[j:j + 2] == b"\\/"))
            if bounded and after == b"/":
                out.append((FOLDERS, None))   # zero or more whole folders
                j += 1
            elif bounded:
                out.append((ANY, None))
            elif not out or out[-1][0] != STAR:   # `a**b` is `a*b`: one STAR is enough
                out.append((STAR, None))
            i = j
        elif ch == b"?":
            out.append((ONE_OF, _NOT_SLASH))
            i += 1
        elif ch == b"[":
            parsed = _bracket(pattern, i)
            if parsed is None:
                return None
            piece, i = parsed
            out.append((ONE_OF, _table(piece)))
        elif ch == b"\\":
            if i + 1 >= n:
                return None
            out.append((BYTE, pattern[i + 1]))
            i += 2
        else:
            out.append((BYTE, pattern[i]))
            i += 1
    return out


_NOT_SLASH = bytes(0 if b == 0x2F else 1 for b in range(256))


def _table(piece: bytes) -> bytes:
    """A one-byte regular expression (a `[...]` set) as a table of the 256 bytes it takes:
    each test is one byte against a set, so the expression cannot backtrack."""
    one = re.compile(piece, re.DOTALL)
    return bytes(1 if one.fullmatch(bytes([b])) else 0 for b in range(256))


def _bracket(pattern: bytes, i: int) -> tuple[bytes, int] | None:
    """The `[...]` starting at pattern[i]: (regex, index after it), or None (wildmatch aborts).
    Follows wildmatch's loop: the first member may be `]`, `a-z` is a range unless `-` ends
    the set, an escaped byte is literal, `[:name:]` is a class, `[:` without `:]` is literal."""
    n = len(pattern)
    i += 1
    negated = pattern[i:i + 1] in (b"!", b"^")
    if negated:
        i += 1
    members: list[bytes] = []
    prev: int | None = None
    first = True
    while True:
        if i >= n:
            return None
        ch = pattern[i]
        if ch == ord("]") and not first:
            break
        first = False
        if ch == ord("\\"):
            i += 1
            if i >= n:
                return None
            prev = pattern[i]
            members.append(_byte(prev))
        elif ch == ord("-") and prev is not None and i + 1 < n and pattern[i + 1] != ord("]"):
            i += 1
            high = pattern[i]
            if high == ord("\\"):
                i += 1
                if i >= n:
                    return None
                high = pattern[i]
            if prev <= high:
                members.append(_byte(prev) + b"-" + _byte(high))
            prev = None
        elif ch == ord("[") and pattern[i + 1:i + 2] == b":":
            end = pattern.find(b"]", i + 2)
            if end < 0:
                return None
            name = pattern[i + 2:end]
            if name.endswith(b":"):
                cls = _CLASSES.get(name[:-1])
                if cls is None:
                    return None
                members.append(_class(cls))
                prev = None
                i = end
            else:
                prev = ch
                members.append(_byte(ch))
        else:
            prev = ch
            members.append(_byte(ch))
        i += 1
    body = b"".join(members)
    if negated:
        return (b"[^/" + body + b"]", i + 1)
    return ((b"(?!/)[" + body + b"]") if body else b"(?!)", i + 1)


def _byte(value: int) -> bytes:
    return b"\\x%02x" % value


def _class(spec: bytes) -> bytes:
    """A class's ASCII spec ("0-9A-Za-z") with every byte escaped, ranges kept."""
    out = []
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1:i + 2] == b"-":
            out.append(_byte(spec[i]) + b"-" + _byte(spec[i + 2]))
            i += 3
        else:
            out.append(_byte(spec[i]))
            i += 1
    return b"".join(out)


def decide(lists: list[list[Rule]], path: bytes, is_dir: bool) -> Rule | None:
    """The rule that decides `path` (relative, `/`-separated), or None: `lists` go from the
    least to the most specific (top folder first); the last matching rule of the most specific
    list wins. Excluded when the answer is a rule that is not negative."""
    for rules in reversed(lists):
        for rule in reversed(rules):
            if rule.matches(path, is_dir):
                return rule
    return None
