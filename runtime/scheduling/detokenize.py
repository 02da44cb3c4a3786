"""Text for a request's tokens: stop conditions (EOS, stop ids and strings, length), the
detokenised text, and stream chunks that hold back what may still change."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.scheduling.request import Request, StreamChunk


class Detokenizer:
    """Decides when a request is finished and what text it has; runs on the scheduler thread."""

    def __init__(self, tokenizer, eos_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

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
            req.text = self.decode(out)
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

    def finalize_text(self, req: Request) -> None:
        if req.matched_stop is None or isinstance(req.matched_stop, int):
            req.text = self.decode(req.output_ids)

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
