"""Model-free drafts from token history: the tokens a response is about to write have often been
written already, earlier in the response or its prompt, by a sibling (another sample of the same
prompt, live), by an earlier epoch's response to the same prompt, or by a recent response to
another prompt. A draft costs no forward pass and needs no trained drafter.

A draft is the continuation of the longest match of the response's suffix in that history. The
history is an index of the most recent occurrences of every n-gram of `min_match` to `key_len`
tokens; the longest key that occurs gives the candidates, each is extended backwards token by
token (up to `max_match`), and the longest match wins, the most recent on a tie. Lookups and updates are a few dictionary operations per token, so a batch of
requests is served in microseconds each. Memory is bounded by tokens: finished responses are
evicted oldest first once a budget is full.

This module knows nothing of an engine: the rollout server feeds it prompts and committed tokens
and asks it for drafts; verification (which keeps speculation lossless) is the engine's.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, model_validator

DocId = Hashable
_RECENT_GENERATIONS = 4


class HistoryConfig(BaseModel):
    """Index shape and memory bounds of the history drafter."""

    min_match: int = Field(1, ge=1, le=8, description="the shortest match drafted from (shortest index key)")
    key_len: int = Field(4, ge=1, le=8, description="the longest index key; longer matches are found by comparing back")
    max_match: int = Field(32, ge=1, le=1024, description="how far back a match is compared to rank candidates")
    candidates: int = Field(4, ge=1, le=64, description="most recent occurrences kept per key")
    responses_per_prompt: int = Field(32, ge=0, description="newest finished responses kept per prompt (earlier epochs)")
    history_tokens: int = Field(
        1_000_000, ge=0, description="finished tokens kept for all prompts together (least recently used prompts dropped)"
    )
    recent_tokens: int = Field(
        100_000, ge=0, description="tokens of the window of recent responses to any prompt (oldest quarter dropped)"
    )

    @model_validator(mode="after")
    def _key_range(self) -> HistoryConfig:
        if self.min_match > self.key_len:
            raise ValueError(f"min_match ({self.min_match}) must not exceed key_len ({self.key_len})")
        return self


@dataclass(frozen=True)
class HistoryDraft:
    """Proposed continuation and the length of the match it continues (0: no match, no tokens)."""

    tokens: tuple[int, ...]
    match_len: int


_NO_DRAFT = HistoryDraft((), 0)


@dataclass
class _Match:
    length: int
    tokens: list[int]
    end: int  # the continuation starts at tokens[end]

    def draft(self, max_tokens: int) -> HistoryDraft:
        return HistoryDraft(tuple(self.tokens[self.end : self.end + max_tokens]), self.length)


class TokenIndex:
    """Where each n-gram of `min_len` to `max_len` tokens occurred last in a set of token sequences
    that grow at their end."""

    def __init__(self, min_len: int, max_len: int, candidates: int) -> None:
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {min_len} and {max_len}")
        self.lengths = range(max_len, min_len - 1, -1)  # longest first, as lookups try them
        self.candidates = candidates
        self.docs: dict[DocId, list[int]] = {}
        # Occurrences oldest first, at most `candidates` (lists: cheaper to create than deques, and
        # most keys occur once).
        self._where: dict[tuple[int, ...], list[tuple[DocId, int]]] = {}

    def extend(self, doc: DocId, tokens: Sequence[int]) -> None:
        """Append `tokens` to `doc` (created if new) and index the keys they complete."""
        seq = self.docs.setdefault(doc, [])
        start = len(seq)
        seq.extend(tokens)
        where, candidates, longest = self._where, self.candidates, self.lengths[0]
        for end in range(start + 1, len(seq) + 1):
            window = tuple(seq[max(0, end - longest) : end])
            for n in self.lengths:
                if n > end:
                    continue
                key = window[-n:]
                occurrences = where.get(key)
                if occurrences is None:
                    where[key] = [(doc, end)]
                else:
                    occurrences.append((doc, end))
                    if len(occurrences) > candidates:
                        del occurrences[0]

    def remove(self, doc: DocId) -> int:
        """Forget `doc` and its keys; the number of tokens it held."""
        seq = self.docs.pop(doc, None)
        if seq is None:
            return 0
        where, longest = self._where, self.lengths[0]
        for end in range(1, len(seq) + 1):
            window = tuple(seq[max(0, end - longest) : end])
            for n in self.lengths:
                if n > end:
                    continue
                key = window[-n:]
                occurrences = where.get(key)
                if occurrences is None:
                    continue
                kept = [o for o in occurrences if o[0] != doc]
                if kept:
                    where[key] = kept
                else:
                    del where[key]
        return len(seq)

    def longest_match(self, context: Sequence[int], max_match: int, prefer: DocId | None = None) -> _Match | None:
        """The occurrence of `context`'s suffix with the longest match and a continuation; on a tie
        the one in document `prefer`, else the most recent."""
        for n in self.lengths:
            if len(context) < n:
                continue
            occurrences = self._where.get(tuple(context[-n:]))
            if not occurrences:
                continue
            best: _Match | None = None
            best_doc = None
            for doc, end in reversed(occurrences):  # most recent first
                seq = self.docs[doc]
                if end >= len(seq):  # the context's own end, or a sequence's last token: nothing follows
                    continue
                limit = min(max_match, end, len(context))
                length = n
                while length < limit and seq[end - length - 1] == context[-length - 1]:
                    length += 1
                if best is None or length > best.length or (length == best.length and doc == prefer != best_doc):
                    best, best_doc = _Match(length, seq, end), doc
            if best is not None:  # any match of a longer key beats every match of a shorter one
                return best
        return None

    def __len__(self) -> int:
        return len(self._where)


@dataclass
class _Group:
    """The history of one prompt: its text, its live responses, and its newest finished ones."""

    index: TokenIndex
    prompt: list[int]
    live: dict[Hashable, int] = field(default_factory=dict)  # request -> its document
    finished: deque[int] = field(default_factory=deque)  # documents, oldest first
    finished_tokens: int = 0


@dataclass
class _Request:
    group: Hashable
    doc_id: int
    doc: list[int]  # the response so far, after the prompt's last key_len tokens


class HistoryDrafter:
    """Drafts for running requests from their prompt group's history and a recent window.

    `start` a request with its prompt group (any hashable: the trainer's group id, or the prompt's
    tokens), `extend` it with each step's committed tokens, `propose` before a step, `finish` when
    it ends (kept for its group's later epochs and for the recent window) or `abort` it.

    Memory is bounded without per-token deletion, which would cost more than the drafting: a group
    keeps its newest `responses_per_prompt` responses (its index is rebuilt from them once twice as
    many have finished), whole groups are dropped least recently used once the finished tokens of
    all groups exceed `history_tokens`, and the recent window is a few generations of indices of
    which the oldest is dropped whole.
    """

    def __init__(self, config: HistoryConfig | None = None) -> None:
        self.config = config or HistoryConfig()
        self._groups: OrderedDict[Hashable, _Group] = OrderedDict()  # least recently started first
        self._requests: dict[Hashable, _Request] = {}
        self._doc_ids = itertools.count()  # request ids may repeat (a re-sent sample); documents must not
        self._history_tokens = 0
        # Across prompts only long matches carry meaning (shared phrasing): one key length suffices.
        self._recent: deque[TokenIndex] = deque()
        self._recent_tokens: deque[int] = deque()

    def start(self, request: Hashable, group: Hashable, prompt: Sequence[int]) -> None:
        """Begin drafting for `request`, a response to `prompt` in prompt group `group`."""
        if request in self._requests:
            raise ValueError(f"request {request!r} is already running")
        entry = self._groups.get(group)
        if entry is None:
            entry = self._groups[group] = _Group(self._index(), list(prompt))
            entry.index.extend("prompt", prompt)
        self._groups.move_to_end(group)
        doc_id = next(self._doc_ids)
        entry.live[request] = doc_id
        # The response's document starts with the prompt's tail, so its first tokens are indexed as
        # the continuation of the prompt (what a sibling will draft) and have a context to match on.
        entry.index.extend(doc_id, prompt[-self.config.key_len :])
        self._requests[request] = _Request(group, doc_id, entry.index.docs[doc_id])

    def extend(self, request: Hashable, tokens: Sequence[int]) -> None:
        """Record tokens `request` committed."""
        state = self._requests[request]
        self._groups[state.group].index.extend(state.doc_id, tokens)

    def propose(self, request: Hashable, max_tokens: int) -> HistoryDraft:
        """Up to `max_tokens` draft tokens for `request`'s next positions."""
        if max_tokens <= 0:
            return _NO_DRAFT
        state = self._requests[request]
        context, max_match = state.doc, self.config.max_match
        # A response's own earlier text beats a sibling's of the same match length: it repeats its
        # own numbers and names, which its siblings (sampled apart) do not share.
        best = self._groups[state.group].index.longest_match(context, max_match, prefer=state.doc_id)
        for generation in reversed(self._recent):  # newest first: it wins ties
            match = generation.longest_match(context, max_match)
            if match is not None and (best is None or match.length > best.length):
                best = match
        return best.draft(max_tokens) if best is not None else _NO_DRAFT

    def finish(self, request: Hashable) -> None:
        """`request` ended: keep its response for its group's later epochs and the recent window."""
        state = self._requests.pop(request)
        group = self._groups[state.group]
        del group.live[request]
        group.finished.append(state.doc_id)
        group.finished_tokens += len(state.doc)
        self._history_tokens += len(state.doc)
        if len(group.finished) > 2 * self.config.responses_per_prompt:
            self._rebuild(group)
        self._add_recent(state.doc_id, state.doc)
        while self._history_tokens > self.config.history_tokens and self._drop_oldest_idle_group():
            pass

    def abort(self, request: Hashable) -> None:
        """`request` ended without a response worth keeping."""
        state = self._requests.pop(request)
        group = self._groups[state.group]
        del group.live[request]
        group.index.remove(state.doc_id)
        if not group.live and not group.finished:
            del self._groups[state.group]

    @property
    def tokens_held(self) -> int:
        """Tokens of finished responses held (the bounded part; live requests are bounded by the engine)."""
        return self._history_tokens + sum(self._recent_tokens)

    @property
    def groups(self) -> int:
        """Prompt groups held."""
        return len(self._groups)

    @property
    def index_keys(self) -> int:
        """Index keys held over all groups and the recent window: what the memory is made of."""
        return sum(len(g.index) for g in self._groups.values()) + sum(len(r) for r in self._recent)

    def _index(self) -> TokenIndex:
        return TokenIndex(self.config.min_match, self.config.key_len, self.config.candidates)

    def _rebuild(self, group: _Group) -> None:
        """Re-index `group` from its prompt, live responses and newest finished responses."""
        old = group.index
        group.index = self._index()
        group.index.extend("prompt", group.prompt)
        while len(group.finished) > self.config.responses_per_prompt:
            dropped = old.docs[group.finished.popleft()]
            group.finished_tokens -= len(dropped)
            self._history_tokens -= len(dropped)
        for doc_id in [*group.finished, *group.live.values()]:
            group.index.extend(doc_id, old.docs[doc_id])
        for request, doc_id in group.live.items():  # the live requests' state follows their new documents
            self._requests[request].doc = group.index.docs[doc_id]

    def _drop_oldest_idle_group(self) -> bool:
        for key, group in self._groups.items():
            if not group.live:
                self._history_tokens -= group.finished_tokens
                del self._groups[key]
                return True
        return False

    def _add_recent(self, doc_id: int, doc: list[int]) -> None:
        budget = self.config.recent_tokens // _RECENT_GENERATIONS
        if budget == 0:
            return
        if not self._recent or self._recent_tokens[-1] >= budget:
            self._recent.append(TokenIndex(self.config.key_len, self.config.key_len, self.config.candidates))
            self._recent_tokens.append(0)
            if len(self._recent) > _RECENT_GENERATIONS:
                self._recent.popleft()
                self._recent_tokens.popleft()
        self._recent[-1].extend(doc_id, doc)
        self._recent_tokens[-1] += len(doc)
