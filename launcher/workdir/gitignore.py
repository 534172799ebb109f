"""Git's ignore rules, read and matched the way git does, without git.

A user's folder need not be a repository and a node need not have git, so launch reads
`.gitignore` files itself. The semantics are git's own (gitignore(5); dir.c and wildmatch.c
of git): a rule list per folder, the last matching rule of the deepest list decides; `!`
re-includes; a trailing `/` matches folders only; a rule with a slash at its start or middle is
anchored to its file's folder, one without matches a name at any depth below it; `*`, `?` and
`[...]` (`!`/`^` negation, ranges, `[:class:]`) never match `/`; `**/`, `/**` and `/**/`
span folders; `\\` escapes (`\\#`, `\\!`, `\\ `); trailing spaces are dropped unless escaped;
CRLF and a UTF-8 BOM are tolerated. Matching is on bytes, as git's is (`?` is one byte).
Whether a file inside an excluded folder can come back is the walker's business: git never
looks inside an excluded folder, and neither does launcher/workdir/scan.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# POSIX classes as git's wildmatch tests them (ASCII only, sane_ctype).
_CLASSES = {
    b"alnum": b"0-9A-Za-z", b"alpha": b"A-Za-z", b"blank": b" \t", b"cntrl": b"\x00-\x1f\x7f",
    b"digit": b"0-9", b"graph": b"!-~", b"lower": b"a-z", b"print": b" -~",
    b"punct": b"!-/:-@[-`{-~", b"space": b" \t\n\v\f\r", b"upper": b"A-Z",
    b"xdigit": b"0-9A-Fa-f",
}


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
    regex: re.Pattern[bytes] | None   # None: a malformed pattern, which git never matches

    def matches(self, path: bytes, is_dir: bool) -> bool:
        if self.regex is None or (self.dir_only and not is_dir):
            return False
        if self.basename:
            return self.regex.fullmatch(path.rpartition(b"/")[2]) is not None
        if self.base:
            if not path.startswith(self.base + b"/"):
                return False
            path = path[len(self.base) + 1:]
        return self.regex.fullmatch(path) is not None

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
        body = _translate(line)
    else:
        # As git's match_pathname(): the part before the first wildcard is compared as it
        # is and wildmatch gets the rest as a pattern of its own, so a `**` right after that
        # part counts as leading (`a**/x` matches `a/x` and `ab/c/x`, as git's does).
        cut = next((i for i, c in enumerate(line) if c in b"*?[\\"), len(line))
        rest = _translate(line[cut:])
        body = None if rest is None else re.escape(line[:cut]) + rest
    return Rule(source=source, line=number, pattern=text, base=base, negative=negative,
                dir_only=dir_only, basename=basename,
                regex=None if body is None else re.compile(body, re.DOTALL))


def _translate(pattern: bytes) -> bytes | None:
    """wildmatch(pattern, WM_PATHNAME) as a regular expression; None where wildmatch aborts
    (an unterminated `[`, an unknown `[:class:]`, a trailing backslash)."""
    out = []
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
                out.append(rb"(?:.*/)?")   # zero or more whole folders
                j += 1
            elif bounded:
                out.append(rb".*")
            else:
                out.append(rb"[^/]*")
            i = j
        elif ch == b"?":
            out.append(rb"[^/]")
            i += 1
        elif ch == b"[":
            parsed = _bracket(pattern, i)
            if parsed is None:
                return None
            piece, i = parsed
            out.append(piece)
        elif ch == b"\\":
            if i + 1 >= n:
                return None
            out.append(re.escape(pattern[i + 1:i + 2]))
            i += 2
        else:
            out.append(re.escape(ch))
            i += 1
    return b"".join(out)


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
