"""Text for a request's tokens: stop conditions (EOS, stop ids and strings, length), the
detokenised text, and stream chunks that hold back what may still change."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.request import Request, StreamChunk

# The text that tool-call and reasoning parsers look for in an answer (the model families' call
# and reasoning markers). Some tokenizers have them as special tokens (Mistral's `[TOOL_CALLS]`,
# Llama 3's `<|python_tag|>`), which decoding without special tokens would drop: such ids are
# spelled in the text of a request that keeps them (`SamplingParams.keep_markers`: a chat
# answer whose parser reads them) and of every constrained request (the constraint vocabulary
# has them as their text, so a grammar can match a call's opening on them).
MARKER_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<think>",
    "</think>",
)
_NONE: frozenset[int] = frozenset()


def special_ids(tokenizer) -> set[int]:
    """The ids `decode(..., skip_special_tokens=True)` drops."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    return ids | {i for i, t in added.items() if getattr(t, "special", False)}


def marker_ids(tokenizer, texts: Sequence[str] = MARKER_TOKENS) -> dict[int, str]:
    """The special tokens of `tokenizer` that spell one of `texts`: id -> text."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    specials = special_ids(tokenizer)
    return {i: str(t.content) for i, t in added.items() if i in specials and t.content in texts}


class Detokenizer:
    """Decides when a request is finished and what text it has; runs on the scheduler thread."""

    def __init__(self, tokenizer, eos_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.markers = marker_ids(tokenizer)  # special ids spelled for the requests keeping them
        self._all_markers = frozenset(self.markers) - self.eos_ids

    def kept(self, req: Request) -> frozenset[int]:
        """The special ids spelled in `req`'s text: the markers it keeps (all of them when it
        is constrained: its grammar matched them as text)."""
        if not self._all_markers:
            return _NONE
        if req.constraint is not None:
            return self._all_markers
        keep = req.params.keep_markers
        if not keep:
            return _NONE
        return frozenset(i for i in self._all_markers if self.markers[i] in keep)

    def decode(self, ids: list[int], keep: frozenset[int] = _NONE) -> str:
        """The text of `ids` without special tokens, but those in `keep` spelled."""
        if not keep or keep.isdisjoint(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        parts, start = [], 0
        for i, t in enumerate(ids):
            if t in keep:
                parts.append(self.tokenizer.decode(ids[start:i], skip_special_tokens=True))
                parts.append(self.markers[t])
                start = i + 1
        parts.append(self.tokenizer.decode(ids[start:], skip_special_tokens=True))
        return "".join(parts)

    def check_finish(self, req: Request, new_tokens: int = 1) -> None:
        """Set `req.finish_reason` (and text) when the last `new_tokens` tokens end it."""
        p = req.params
        out = req.output_ids
        for tok in out[len(out) - new_tokens :]:
            if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
                req.finish_reason, req.matched_stop = "stop", tok
                # drop whatever a multi-token step appended after the stop token
                del out[out.index(tok, len(out) - new_tokens) + 1 :]
                break
        if req.finish_reason is None and (p.stop or req.stream):
            req.text = self.text(req)
            if p.stop:
                self._check_stop_strings(req)
        if req.finish_reason is None and len(out) >= p.max_new_tokens:
            req.finish_reason = "length"

    def _check_stop_strings(self, req: Request) -> None:
        text = req.text
        # a new stop string can only start near the end of the text
        window = max(len(s) for s in req.params.stop) + 32
        start = max(0, req.streamed_text_len - window, len(text) - window * 4)
        best = None
        for s in req.params.stop:
            at = text.find(s, start)
            if at != -1 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            req.text = text[: best[0]]
            req.finish_reason, req.matched_stop = "stop", best[1]

    def text(self, req: Request) -> str:
        """The text of `req`'s output tokens; with token healing, without the prefix they spell
        again (the tokens were chosen to start with it, so the decoded text does too: "" until
        it is spelled)."""
        heal = req.heal_text
        if not heal:
            return self.decode(req.output_ids, self.kept(req))
        # decoded after the prompt's last token: a tokenizer that drops a leading space when it
        # decodes from the start (SentencePiece's) keeps the prefix's; then both are cut off
        keep, anchor = self.kept(req), req.prompt_ids[-1:]
        head = self.decode(anchor, keep)
        text = self.decode(anchor + req.output_ids, keep)
        if not text.startswith(head):
            head, text = "", self.decode(req.output_ids, keep)
        return text[len(head) + len(heal) :]

    def finalize_text(self, req: Request) -> None:
        if req.matched_stop is None or isinstance(req.matched_stop, int):
            req.text = self.text(req)

    def stream_chunk(self, req: Request, finished: bool) -> StreamChunk | None:
        """The text and tokens produced since the last chunk, holding back what may still change:
        an incomplete UTF-8 character, or a tail that could be the start of a stop string."""
        text = req.text
        end = len(text)
        if not finished:
            while end > req.streamed_text_len and text[end - 1] == "\ufffd":
                end -= 1
            for s in req.params.stop:
                for k in range(min(len(s) - 1, end), 0, -1):
                    if text[end - k : end] == s[:k]:
                        end = min(end, len(text) - k)
                        break
        end = max(end, req.streamed_text_len)
        delta = text[req.streamed_text_len : end]
        tokens = req.output_ids[req.streamed_token_len :]
        st = req.constraint
        if not finished and st is not None and st.jump_forward:
            tokens = []  # a later jump may re-tokenise them: ids come with the last chunk
        if not delta and not tokens and not finished:
            return None
        req.streamed_text_len = end
        req.streamed_token_len += len(tokens)
        return StreamChunk(
            text_delta=delta,
            token_ids=tokens,
            finished=finished,
            result=req.to_result() if finished else None,
        )
