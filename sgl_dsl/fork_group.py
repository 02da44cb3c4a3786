"""What a program sees of `s.fork(n)`, shared by the interpreter's and the tracer's groups."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from .errors import ProgramError

S = TypeVar("S")


class ForkSequence(Generic[S]):
    """The forks of one `s.fork(n)` as a sequence: index or iterate them, `forks[i] += ...`."""

    forks: list[S]

    def __getitem__(self, index: int) -> S:
        return self.forks[index]

    def __setitem__(self, index: int, value: S) -> None:
        # `forks[i] += expr` appends in place and stores the same fork back
        if value is not self.forks[index]:
            raise ProgramError("a fork can only be appended to (forks[i] += ...), not replaced")

    def __iter__(self) -> Iterator[S]:
        return iter(self.forks)

    def __len__(self) -> int:
        return len(self.forks)

    def __iadd__(self, other: Any) -> ForkSequence[S]:
        """SGLang's `forks += ...`: a function of the fork index (`lambda i: ...`), a list or
        tuple (one item per fork), or one expression / text appended to every fork."""
        for i, fork in enumerate(self.forks):
            if callable(other):
                item = other(i)
            elif isinstance(other, list | tuple):
                if len(other) != len(self.forks):
                    raise ProgramError(
                        f"forks += a list of {len(other)} items, but there are "
                        f"{len(self.forks)} forks"
                    )
                item = other[i]
            else:
                item = other
            fork += item  # type: ignore[operator]  # appends in place
        return self


JOIN_MODES = ("gather_variable", "concate_and_append")


def check_join_mode(mode: str) -> None:
    if mode not in JOIN_MODES:
        raise ProgramError(f"invalid join mode {mode!r}; use one of {list(JOIN_MODES)}")
