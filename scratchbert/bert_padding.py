"""The padding-free path: run BERT's layers on the real tokens only, and sparse MLM prediction.

A padded batch spends as much arithmetic on `[PAD]` positions as on text. Everything in a BERT
layer except attention treats each token on its own (the Q/K/V projections, the output
projections, the feed-forward block, the LayerNorms), so those layers can run on the real tokens
of all sequences packed into one `(T, H)` matrix. Only attention needs to know where one
sequence ends and the next begins. This module

1. describes the packing once per forward pass (`pack_sequences` -> `PackedSequences`),
2. moves tensors between the padded and the packed layout (`unpad`, `pad`),
3. runs attention over the packed tokens, each sequence attending only to itself
   (`packed_attention`), and
4. picks the labelled positions for sparse MLM prediction (`labelled_tokens`).

How attention is batched. One `F.scaled_dot_product_attention` call per sequence is exact but
pays a fixed cost per call, which is large for short sequences on a busy CPU; one call for the
whole batch padded to its longest sequence wastes the quadratic work the path exists to save
(and torch's jagged nested tensors measured slower than dense SDPA on this project's CPU).
`plan_buckets` sorts the sequences by length and cuts them into a few buckets, each padded
only to its own longest member, choosing the cuts that minimise (attention work + a fixed cost
per call) with a small dynamic programme. Padded key slots inside a bucket are masked, so the
result equals attention over each sequence alone.

Outputs at padded positions. The padded path computes a vector for every `[PAD]` position too
(a pad query attends to the real keys of its row); the padding-free path does not compute them
and returns zeros there. At real positions the two agree to float rounding (~1e-6 in fp32).
A row with no real token at all (all-zero attention mask) comes back as zeros, never NaN.

Notation: B batch, S padded length, T real tokens in the batch (sum of the mask),
H hidden size, A heads, D head size, n sequences in a bucket, L a bucket's length,
N labelled tokens, V vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

IGNORE_INDEX = -100  # label value that contributes no loss (same as the modeling file's)

# The fixed cost of one attention call, in units of attention work (one unit = one query-key
# score per head). 128**2 means: "starting a call costs about as much as attending over a
# 128-token sequence". Smaller values give more, tighter buckets; larger fewer, looser ones.
CALL_COST = 128 * 128


@dataclass
class AttentionBucket:
    """Sequences of similar length attended together in one call, padded to the longest.

    rows: this bucket's slice of the gathered grid rows (see `PackedSequences.gather`), n * L
        rows that view as (n, L): sequence by sequence, slot by slot.
    key_mask: (n, 1, 1, L) additive mask hiding the slots past each sequence's end, or None
        when all n sequences have length L exactly.
    """

    rows: slice
    key_mask: torch.Tensor | None
    num_seqs: int
    length: int


@dataclass
class PackedSequences:
    """Where the real tokens of a padded (B, S) batch sit once packed into (T, ...).

    indices: (T,) positions b * S + s of the real tokens in the flattened batch, row-major, so
        the tokens of sequence b are contiguous and in their original order.
    cu_seqlens: (B + 1,) cumulative sequence lengths; sequence b is rows
        cu_seqlens[b]:cu_seqlens[b + 1] of the packed tensor (empty for a fully padded row).
    max_seqlen: the longest sequence, in real tokens.
    batch, seq: B and S, to restore the padded layout.
    buckets: how `packed_attention` groups the sequences (see `plan_buckets`).
    gather: (R,) for every slot of every bucket grid (R = sum of n * L), the packed row it
        reads: one `index_select` lays out all buckets at once. Slots past a sequence's end
        read its first token; they are masked as keys and their outputs are dropped.
    restore: (T,) for packed token t, its row among the R grid rows.
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch: int
    seq: int
    buckets: list[AttentionBucket]
    gather: torch.Tensor
    restore: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.indices.numel()


def plan_buckets(lengths: list[int], call_cost: int | None = None) -> list[list[int]]:
    """Group sequences for attention: lengths (B,) -> buckets, each a list of sequence indices.

    Sequences of length 0 are left out (they have nothing to attend). The rest are sorted longest
    first and cut into contiguous runs; a run of n sequences whose longest has length L costs
    n * L**2 + call_cost (default `CALL_COST`). An O(K**2) dynamic programme over the K distinct
    lengths finds the cheapest cuts (K <= S, and a few dozen for typical batches). Each bucket
    lists its sequences longest first.
    """
    call_cost = CALL_COST if call_cost is None else call_cost
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    if not order:
        return []
    # Collapse equal lengths: a bucket boundary never falls between two equal lengths.
    distinct: list[int] = []  # lengths, longest first
    counts: list[int] = []
    for i in order:
        if distinct and distinct[-1] == lengths[i]:
            counts[-1] += 1
        else:
            distinct.append(lengths[i])
            counts.append(1)
    k = len(distinct)
    # best[j]: cheapest cost of the first j distinct lengths; cut[j]: where its last bucket starts.
    best = [0.0] + [float("inf")] * k
    cut = [0] * (k + 1)
    for j in range(1, k + 1):
        members = 0
        for i in range(j - 1, -1, -1):  # last bucket = distinct lengths i..j-1, padded to distinct[i]
            members += counts[i]
            cost = best[i] + members * distinct[i] ** 2 + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    # Walk the cuts back to buckets of sequence indices.
    bounds, j = [], k
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    return [order[starts[i] : starts[j]] for i, j in reversed(bounds)]


def pack_sequences(
    attention_mask: torch.Tensor,
    make_key_mask: Callable[[torch.Tensor], torch.Tensor],
    call_cost: int | None = None,
) -> PackedSequences:
    """Describe the packing of a padded batch, once per forward pass; every layer reuses it.

    attention_mask: (B, S), 1 for a real token and 0 for padding, in any pattern (right or left
        padding, or gaps): each row's real tokens keep their order and attend only to each other.
    make_key_mask: turns a (n, L) keep-mask into the (n, 1, 1, L) additive bias the attention
        function expects (the model's own mask builder, so masks are made one way everywhere).
    call_cost: the fixed cost of an attention call for `plan_buckets` (default `CALL_COST`).
    Returns a `PackedSequences` (see its fields). One host sync reads the sequence lengths.
    """
    batch, seq = attention_mask.shape
    keep = attention_mask.bool()
    device = attention_mask.device
    indices = keep.reshape(-1).nonzero().squeeze(1)  # (T,)
    lengths_t = keep.sum(dim=1)  # (B,)
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.long, device=device)
    cu_seqlens[1:] = lengths_t.cumsum(0)
    lengths = lengths_t.tolist()
    starts = cu_seqlens[:-1].tolist()

    buckets, gathers, real_rows, real_tokens, offset = [], [], [], [], 0
    for members in plan_buckets(lengths, call_cost):
        length = lengths[members[0]]  # longest first
        member_starts = torch.tensor([starts[i] for i in members], device=device)  # (n,)
        member_lengths = torch.tensor([lengths[i] for i in members], device=device)  # (n,)
        slot = torch.arange(length, device=device)  # (L,)
        valid = slot[None, :] < member_lengths[:, None]  # (n, L): which slots hold a real token
        # Slots past a sequence's end read its first token: any real row works, they are masked.
        gather = member_starts[:, None] + torch.where(valid, slot[None, :], 0)  # (n, L)
        padded = not bool(valid.all())
        buckets.append(
            AttentionBucket(
                rows=slice(offset, offset + gather.numel()),
                key_mask=make_key_mask(valid.long()) if padded else None,
                num_seqs=len(members),
                length=length,
            )
        )
        flat_valid = valid.reshape(-1)
        gathers.append(gather.reshape(-1))
        real_rows.append(offset + flat_valid.nonzero().squeeze(1))  # grid rows that hold a real token
        real_tokens.append(gather.reshape(-1)[flat_valid])  # ... and which packed token each one is
        offset += gather.numel()

    restore = torch.empty(indices.numel(), dtype=torch.long, device=device)
    if real_tokens:
        restore[torch.cat(real_tokens)] = torch.cat(real_rows)
    return PackedSequences(
        indices=indices,
        cu_seqlens=cu_seqlens,
        max_seqlen=max(lengths, default=0),
        batch=batch,
        seq=seq,
        buckets=buckets,
        gather=torch.cat(gathers) if gathers else torch.zeros(0, dtype=torch.long, device=device),
        restore=restore,
    )


def unpad(padded: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
    """Keep the real tokens: (B, S, ...) -> (T, ...). Differentiable (the gradient scatters back)."""
    return padded.reshape(packed.batch * packed.seq, *padded.shape[2:]).index_select(0, packed.indices)


def pad(tokens: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
    """Restore the padded layout: (T, ...) -> (B, S, ...), zeros at padded positions. Differentiable."""
    flat = tokens.new_zeros(packed.batch * packed.seq, *tokens.shape[1:])
    return flat.index_copy(0, packed.indices, tokens).view(packed.batch, packed.seq, *tokens.shape[1:])


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    packed: PackedSequences,
    num_heads: int,
    attend: Callable,
    dropout_p: float,
) -> torch.Tensor:
    """Multi-head attention within each sequence of a packed batch.

    query, key, value: (T, H) projections of the packed tokens. `attend(q, k, v, mask, dropout_p)`
    is one of the model's attention functions (written-out or SDPA), called once per bucket with
    q, k, v (n, A, L, D) and the bucket's key mask. Returns the merged-heads context (T, H), in
    packed order, equal to attending over each sequence on its own.
    """
    tokens, hidden = query.shape
    head_dim = hidden // num_heads
    if not packed.buckets:  # every row fully padded: nothing to attend
        return query.new_zeros(tokens, hidden)
    # One gather per projection lays out every bucket's grid; a bucket is then a slice (no copy).
    grids = [x.index_select(0, packed.gather) for x in (query, key, value)]  # 3 x (R, H)
    outputs = []
    for bucket in packed.buckets:
        shape = (bucket.num_seqs, bucket.length, num_heads, head_dim)
        q, k, v = (grid[bucket.rows].view(shape).transpose(1, 2) for grid in grids)  # (n, A, L, D) each
        context, _ = attend(q, k, v, bucket.key_mask, dropout_p)  # (n, A, L, D)
        outputs.append(context.transpose(1, 2).reshape(bucket.num_seqs * bucket.length, hidden))  # (n * L, H)
    context = outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # (R, H)
    return context.index_select(0, packed.restore)  # (T, H), packed order


def labelled_tokens(hidden_states: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLM prediction: keep only the positions that carry a label.

    hidden_states (B, S, H), labels (B, S) with -100 = no label -> (N, H) and their labels (N,),
    in row-major order. The MLM head then runs on N rows instead of B * S (about 15% of them in
    BERT pretraining), and the mean cross-entropy over the N rows equals the dense one, which
    ignores the -100 positions anyway.
    """
    labels = labels.to(hidden_states.device)
    chosen = (labels != IGNORE_INDEX).reshape(-1).nonzero().squeeze(1)  # (N,)
    flat = hidden_states.reshape(-1, hidden_states.size(-1))  # (B * S, H)
    return flat.index_select(0, chosen), labels.reshape(-1).index_select(0, chosen)
