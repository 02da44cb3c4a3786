"""The responses a client asked the server to keep (`store`, on by default as in OpenAI's API),
bounded: `GET /v1/responses/{id}`, `DELETE`, and `previous_response_id` read them.

A stored response keeps its response object and the conversation that led to it: the input
items of every response before it in the chain (`previous_response_id`), its own input items
and its output items; a response that continues it reads that conversation as its history.
Past `capacity` responses, the least recently used is dropped (a `previous_response_id`
naming it is then a 404, as for one never stored).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_CAPACITY = 1024


@dataclass(slots=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # the history before it and its own input
    output_items: list[dict[str, Any]]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The items a response continuing this one reads as its history."""
        return [*self.input_items, *self.output_items]


class ResponseStore:
    """Stored responses by id, least recently used dropped past `capacity`."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a response store holds at least one response, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, stored: StoredResponse) -> None:
        with self._lock:
            self._items[stored.response["id"]] = stored
            self._items.move_to_end(stored.response["id"])
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)
            return stored

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)
