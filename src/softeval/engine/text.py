"""Completions as text: the tokens a row generates decoded as they come, cut at the first stop
string that follows the answer's first character, and why each completion ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# tokens decoded again as context after the decoding of earlier tokens changed
RESYNC_CONTEXT = 8


@dataclass
class Completion:
    text: str  # cut before the first stop string that follows the answer's first character
    tokens: list[int]  # every generated token, the stop string's included (EOS excluded)
    stop_reason: str  # "stop", "eos" or "length"
    raw: str = ""  # every generated token decoded, nothing cut


class TextStream:
    """One row's generated tokens and their text, decoded incrementally: each token decodes a
    few tokens of context, not the whole completion, and stop strings are looked for only where
    the new text could complete one.

    The text is the tokenizer's decoding of all tokens so far (checked in the tests); a stop
    string found in it is confirmed on a full decode, the completion's text always is one."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.longest_stop = max(map(len, self.stop), default=0)
        self.tokens: list[int] = []
        self.text = ""
        # tokens[start:read] decode to the last stable piece of text: context for the next token
        self.start = self.read = 0
        self.latest = ""  # the text with the newest tokens, an incomplete character included

    def append(self, token: int) -> bool:
        """Add a token; whether a stop string now ends the completion."""
        self.tokens.append(token)
        decode = self.tokenizer.decode
        before = decode(self.tokens[self.start : self.read], skip_special_tokens=True)
        after = decode(self.tokens[self.start :], skip_special_tokens=True)
        if after.startswith(before):
            self.latest = self.text + after[len(before) :]
            look_from = len(self.text) - self.longest_stop + 1
            # an incomplete UTF-8 sequence decodes to U+FFFD: keep its tokens as context until
            # the tokens that complete it arrive
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self.text = self.latest
                self.start, self.read = self.read, len(self.tokens)
        else:  # the decoding of earlier tokens changed: decode them all once and go on from there
            self.latest = self.text = self._full_text()
            self.start, self.read = max(0, len(self.tokens) - RESYNC_CONTEXT), len(self.tokens)
            look_from = 0
        begins = len(self.latest) - len(self.latest.lstrip())  # stop strings count after it
        if begins == len(self.latest) or not any(s in self.latest[max(begins, look_from) :] for s in self.stop):
            return False
        return _first_stop(self._full_text(), self.stop) is not None

    def _full_text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def completion(self, reason: str) -> Completion:
        text = self._full_text()
        cut = _first_stop(text, self.stop)  # after eos or at the length limit too, as a safeguard
        return Completion(text if cut is None else text[:cut], self.tokens, reason, raw=text)


def ended_by(text: TextStream, token: int, eos: set[int], max_new_tokens: int) -> Completion | None:
    """Add a generated token to a completion; the completion if the token ends it (EOS, a stop
    string, the token limit), else None."""
    if token in eos:
        return text.completion("eos")
    if text.append(token):
        return text.completion("stop")
    if len(text.tokens) >= max_new_tokens:
        return text.completion("length")
    return None


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where the first stop string begins, counting only stop strings after the first
    non-whitespace character: a base model that answers "\nParis" is not cut to nothing."""
    begin = len(text) - len(text.lstrip())
    cuts = [at for s in stop if s and (at := text.find(s, begin)) >= 0]
    return min(cuts) if cuts else None
