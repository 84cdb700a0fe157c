"""The modes of a command that does several things behind one name (`diff`'s trace, --deep,
--stats and --engine-b comparisons): each mode declared once, with the options that choose it
and those it takes, and from that one declaration the refusal of an option a mode does not
take (one line that names the mode it belongs to), the paragraph of the command's --help and
the table of its docs page (tests/test_modes.py holds the page to the declaration).

A command's folder declares `MODES = (Mode(...), ...)` in modes.py, the modes that an option
chooses first (in the order they are tried) and the default mode last (chosen by nothing), or no
default where one of the modes must be chosen (`steer`'s sources of the vector)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fptrace.errors import BadInput


@dataclass(frozen=True)
class Mode:
    """One mode of a command: how it is spelled (`diff --stats`), what it compares or does, the
    options that choose it (none: the default) and the other options it takes."""

    spelled: str
    what: str
    chosen_by: tuple[str, ...]
    takes: tuple[str, ...]
    refuses: tuple[tuple[str, str], ...] = ()
    """(option, line): an option of another mode this one refuses with a line of its own, where
    the line naming the option's mode would say less (`features train`'s --layers); `{value}`
    in the line is what was given."""

    def accepts(self, flag: str) -> bool:
        return flag in self.chosen_by or flag in self.takes


def chosen(modes: Sequence[Mode], given: Mapping[str, object], missing: str = "") -> Mode:
    """The mode the given options choose (the first whose choosing option is given, else the
    default), or BadInput naming the first given option it does not take and the modes that
    do (or the mode's own line for it). `given`: every mode option of the command, and whether
    it was given (or what was given: a true value). A command whose
    every mode is chosen by an option (no default) needs one: `missing` says what is missing,
    and the modes are listed after it."""
    default = next((m for m in modes if not m.chosen_by), None)
    mode = next((m for m in modes if any(given.get(f) for f in m.chosen_by)), default)
    if mode is None:
        raise BadInput(f"{missing}: " + "; ".join(f"`{m.spelled}` ({m.what})" for m in modes))
    for flag, on in given.items():
        if on and not mode.accepts(flag):
            own = dict(mode.refuses).get(flag)
            if own is not None:
                raise BadInput(own.format(value=on))
            others = [m for m in modes if m.accepts(flag)]
            where = " or ".join(f"`{m.spelled}` ({m.what})" for m in others)
            raise BadInput(f"{flag} is not an option of `{mode.spelled}` ({mode.what})" +
                           (f"; it belongs to {where}" if where else ""))
    return mode


def help_paragraph(modes: Sequence[Mode]) -> str:
    """The modes as one paragraph of --help (Typer's help keeps a paragraph on one line)."""
    return "Modes: " + "; ".join(
        f"{m.spelled}: {m.what}" + (f" (also {', '.join(m.takes)})" if m.takes else "")
        for m in modes) + "."


def markdown(modes: Sequence[Mode]) -> str:
    """The modes as a Markdown table for the command's docs page."""
    rows = ["| mode | what | chosen by | also takes |", "|---|---|---|---|"]
    for m in modes:
        chosen_by = ", ".join(f"`{f}`" for f in m.chosen_by) or "(the default)"
        takes = ", ".join(f"`{f}`" for f in m.takes) or "nothing more"
        rows.append(f"| `{m.spelled}` | {m.what} | {chosen_by} | {takes} |")
    return "\n".join(rows) + "\n"


__all__ = ["Mode", "chosen", "help_paragraph", "markdown"]
