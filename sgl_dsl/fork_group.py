"""What a program sees of `s.fork(n)`, shared by the interpreter's and the tracer's groups."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

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
