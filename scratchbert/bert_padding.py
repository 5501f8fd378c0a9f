"""The padding-free path: run BERT's layers on the real tokens only, and sparse MLM prediction.

A padded batch spends as much arithmetic on `[PAD]` positions as on text. Everything in a BERT
layer except attention treats each token on its own (the Q/K/V projections, the output
projections, the feed-forward block, the LayerNorms), so those layers can run on the real tokens
of all sequences packed into one `(R, H)` matrix. Only attention needs to know where one
sequence ends and the next begins. This module

1. plans the packed layout once per forward pass (`plan_buckets`, `pack_sequences` ->
   `PackedSequences`),
2. moves tensors between the padded and the packed layout (`unpad`, `pad`),
3. runs attention over the packed tokens, each sequence attending only to itself
   (`packed_attention`), and
4. picks the labelled positions for sparse MLM prediction (`labelled_tokens`).

The layout: buckets of similar-length sequences. The packed rows are grouped into buckets,
each a grid of n sequences x L slots, L the bucket's longest sequence, laid out sequence by
sequence. A (n * L, H) slice of the packed tensor then *is* a (n, A, L, D) attention input by
a view, so each bucket takes one call of the model's attention function, with no gather or
scatter in any layer. Sequences of equal length share a bucket with no padding at all; a
bucket that mixes lengths carries a few padded slots, masked as keys. `plan_buckets` chooses
the buckets with a small dynamic programme over the sorted lengths that minimises the work:
linear layers on every slot, attention over every slot pair, and a fixed cost per call. One
call per sequence pays that fixed cost too often (it is large for short sequences on a busy
CPU); one call for the whole batch padded to its longest sequence is the padded path again;
torch's jagged nested tensors measured slower than dense SDPA on this project's CPU.

Tracing. The plan is read from the mask's values on the host, so a tracer (torch.compile,
torch.export, torch.jit.trace, ONNX export) would record this batch's plan as constants and
replay it on every other batch. While one is recording (`is_tracing`), the model takes the
padded path instead: plain attention with a (B, 1, 1, S) mask, right for any batch.

Outputs at padded positions. The padded path computes a vector for every `[PAD]` position too
(a pad query attends to the real keys of its row); the padding-free path does not compute them
and returns zeros there. At real positions the two agree to float rounding (~1e-6 in fp32).
A row with no real token at all (all-zero attention mask) comes back as zeros, never NaN.

Notation: B batch, S padded length, T real tokens in the batch (sum of the mask), R packed
rows (T plus the padded slots of mixed buckets), H hidden size, I intermediate size, A heads,
D head size, n sequences in a bucket, L a bucket's length, N labelled tokens, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# The fixed cost of one attention call, in units of attention work (one unit = one query-key
# pair, all heads). 128**2 means: "starting a call costs about as much as attending over a
# 128-token sequence" (about a millisecond at bert-base width on two cores).
CALL_COST = 128 * 128
# In bf16 / fp16 the matrix multiplies run several times faster (AMX / AVX-512 BF16 units) while a
# call's fixed cost stays about the same, so one call weighs more against the work it saves:
# measured on bert-base, 4x CALL_COST gave the fastest bf16 plans (fewer, slightly padded buckets).
REDUCED_PRECISION_CALL_COST = 4 * CALL_COST


def default_call_cost(dtype: torch.dtype, device: torch.device = torch.device("cpu")) -> float:
    """`plan_buckets`' fixed cost per attention call for computation in `dtype` on `device`.

    By dtype alone; the model's CPU fast path passes its own (`cpu_kernels.attention_call_cost`:
    bf16 run on fp32 kernels weighs calls as fp32 does).
    """
    return REDUCED_PRECISION_CALL_COST if dtype in (torch.bfloat16, torch.float16) else CALL_COST


@dataclass
class AttentionBucket:
    """n sequences of similar length attended together in one call, padded to the longest, L.

    rows: the bucket's rows of the packed (R, ...) tensor, n * L of them, viewing as (n, L).
    key_mask: (n, 1, 1, L) additive mask hiding the slots past each sequence's end, or None
        when all n sequences have length L exactly.
    """

    rows: slice
    key_mask: torch.Tensor | None
    num_seqs: int
    length: int


@dataclass
class PackedSequences:
    """Where the real tokens of a padded (B, S) batch sit in the packed (R, ...) layout.

    source: (R,) for each packed row, the position b * S + s of the flattened batch it reads;
        a padded slot of a mixed bucket reads its sequence's first token (it is masked as a key,
        and its output is dropped).
    real_rows: (T,) the packed rows that hold a real token, or None when every row does (R = T).
    real_positions: (T,) the flattened batch position b * S + s of each of those rows.
    cu_seqlens: (B + 1,) cumulative real lengths in batch order (sequence b has
        cu_seqlens[b + 1] - cu_seqlens[b] tokens; 0 for a fully padded row).
    max_seqlen: the longest sequence, in real tokens.
    batch, seq: B and S, to restore the padded layout.
    buckets: the attention buckets, in packed-row order (see `plan_buckets`).
    """

    source: torch.Tensor
    real_rows: torch.Tensor | None
    real_positions: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch: int
    seq: int
    buckets: list[AttentionBucket]

    @property
    def num_rows(self) -> int:
        return self.source.numel()

    @property
    def num_tokens(self) -> int:
        return self.real_positions.numel()


def is_tracing() -> bool:
    """Whether a tracer or compiler is recording the model rather than running it.

    torch.compile and torch.export (which ONNX's dynamo exporter uses) report themselves through
    `torch.compiler.is_compiling()`, torch.jit.trace and the TorchScript-based ONNX exporter
    through `torch.jit.is_tracing()` and `torch.onnx.is_in_onnx_export()`. A recorded graph
    keeps the operations, not Python's decisions on tensor values, so plans read from values
    (`pack_sequences`) must not be made then.
    """
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()


# The device types with an autocast mode, read once at import. Where a backend registers later
# (a renamed privateuse1 device), `autocast_dtype` asks torch itself, except under a compiler:
# torch.compile before torch 2.13 cannot trace that C call, and a set lookup it can.
AUTOCAST_DEVICE_TYPES = frozenset(
    name for name in ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia", torch._C._get_privateuse1_backend_name())
    if torch.amp.is_autocast_available(name)
)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes in on `device`, or None where autocast is off (or the device type,
    e.g. meta, has no autocast)."""
    available = device.type in AUTOCAST_DEVICE_TYPES or (not is_tracing() and torch.amp.is_autocast_available(device.type))
    if available and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None


def plan_buckets(lengths: list[int], token_cost: float, call_cost: float | None = None) -> list[list[int]]:
    """Group sequences for attention: lengths (B,) -> buckets, each a list of sequence indices.

    A bucket is a run of the sequences sorted longest first; with n members and longest length
    L it costs  token_cost * n * L  (the linear layers on its n * L slots)  +  n * L**2
    (attention)  +  call_cost (default `CALL_COST`). All in units of one attention query-key
    pair. An O(K**2) dynamic programme over the K distinct lengths finds the cheapest plan
    (K <= S). Sequences of length 0 are left out; each bucket lists its members longest first.
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
            cost = best[i] + members * distinct[i] * (token_cost + distinct[i]) + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], k  # walk the cuts back
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    return [order[starts[i] : starts[j]] for i, j in reversed(bounds)]


def linear_cost_per_token(config) -> float:
    """A BERT layer's linear work per token in units of one attention query-key pair.

    Per token: 2 * (4 H^2 + 2 H I) FLOPs (Q, K, V, output projection; feed-forward in and out).
    Per query-key pair: 4 H FLOPs (the Q K^T score and the probs @ V sum, all heads). Ratio 2H + I.
    """
    return 2 * config.hidden_size + config.intermediate_size


def real_token_grid(keep: torch.Tensor) -> torch.Tensor:
    """The flattened positions b * S + s of each row's real tokens, in order, padded with -1: (B, S)."""
    batch, seq = keep.shape
    ranks = keep.long().cumsum(dim=1) - 1  # rank of each real token within its row
    where = torch.full((batch, seq), -1, dtype=torch.long, device=keep.device)
    positions = torch.arange(batch * seq, device=keep.device).view(batch, seq)
    where[keep.nonzero(as_tuple=True)[0], ranks[keep]] = positions[keep]
    return where


def _buckets_of(where: torch.Tensor, lengths: list[int], plan: list[list[int]], make_key_mask) -> tuple[list, list, list]:
    """Each planned bucket's rows of the packed layout: (buckets, the source position of each row, which rows are real)."""
    buckets, sources, valids, offset = [], [], [], 0
    for members in plan:
        length = lengths[members[0]]  # longest first
        index = torch.tensor(members, device=where.device)
        grid = where[index, :length]  # (n, L): real positions, -1 past each sequence's end
        valid = grid >= 0
        first = grid[:, :1].expand_as(grid)  # a padded slot reads its sequence's first token
        sources.append(torch.where(valid, grid, first).reshape(-1))
        valids.append(valid.reshape(-1))
        padded = not bool(valid.all())
        buckets.append(
            AttentionBucket(
                rows=slice(offset, offset + grid.numel()),
                key_mask=make_key_mask(valid.long()) if padded else None,
                num_seqs=len(members),
                length=length,
            )
        )
        offset += grid.numel()
    return buckets, sources, valids


def pack_sequences(
    attention_mask: torch.Tensor,
    config,
    make_key_mask: Callable[[torch.Tensor], torch.Tensor],
    call_cost: float,
) -> PackedSequences:
    """Plan the packed layout of a padded batch, once per forward pass; every layer reuses it.

    attention_mask: (B, S), 1 for a real token and 0 for padding, in any pattern (right or left
        padding, or gaps): each row's real tokens keep their order and attend only to each other.
    config: the model's config (hidden and intermediate sizes weigh linear work vs attention).
    make_key_mask: turns a (n, L) keep-mask into the (n, 1, 1, L) additive bias the attention
        function expects (the model's own mask builder, so masks are made one way everywhere).
    call_cost: the fixed cost of an attention call for `plan_buckets` (the caller's
        `default_call_cost` of the dtype its layers compute in).
    Returns a `PackedSequences` (see its fields). One host sync reads the sequence lengths.
    Eager only: under a tracer (`is_tracing`) the plan would be frozen into the graph.
    """
    if is_tracing():
        raise RuntimeError("pack_sequences plans from the mask's values and cannot be traced; trace the padded path.")
    batch, seq = attention_mask.shape
    device = attention_mask.device
    keep = attention_mask.bool()
    lengths_t = keep.sum(dim=1)  # (B,)
    lengths = lengths_t.tolist()
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.long, device=device)
    cu_seqlens[1:] = lengths_t.cumsum(0)
    where = real_token_grid(keep)
    plan = plan_buckets(lengths, linear_cost_per_token(config), call_cost)
    buckets, sources, valids = _buckets_of(where, lengths, plan, make_key_mask)

    empty = torch.zeros(0, dtype=torch.long, device=device)
    source = torch.cat(sources) if sources else empty
    valid = torch.cat(valids) if valids else empty.bool()
    all_real = bool(valid.all())
    return PackedSequences(
        source=source,
        real_rows=None if all_real else valid.nonzero().squeeze(1),
        real_positions=source if all_real else source[valid],
        cu_seqlens=cu_seqlens,
        max_seqlen=max(lengths, default=0),
        batch=batch,
        seq=seq,
        buckets=buckets,
    )


def unpad(padded: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
    """Gather the packed rows: (B, S, ...) -> (R, ...). Differentiable (the gradient scatters back)."""
    return padded.reshape(packed.batch * packed.seq, *padded.shape[2:]).index_select(0, packed.source)


def pad(rows: torch.Tensor, packed: PackedSequences) -> torch.Tensor:
    """Restore the padded layout: (R, ...) -> (B, S, ...), zeros at padded positions. Differentiable."""
    real = rows if packed.real_rows is None else rows.index_select(0, packed.real_rows)  # (T, ...)
    flat = rows.new_zeros(packed.batch * packed.seq, *rows.shape[1:])
    return flat.index_copy(0, packed.real_positions, real).view(packed.batch, packed.seq, *rows.shape[1:])


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    packed: PackedSequences,
    attend: Callable,
    dropout: float,
) -> torch.Tensor:
    """Multi-head attention within each sequence of a packed batch.

    module: the self-attention layer (its `num_heads`, `scaling`; passed on to `attend`).
    query, key, value: (R, H) projections of the packed rows. `attend` is an attention function
    in the calling convention of transformers' registry, "eager" (the model's written-out
    `eager_attention_forward`) or "sdpa" (the registry's, or the CPU fast path's), called once per
    bucket with q, k, v (n, A, L, D), views of the packed rows (no copy), and the bucket's additive
    key mask; it returns (n, L, A, D). Returns the merged-heads context (R, H), equal to attending
    over each sequence on its own.
    """
    rows, hidden = query.shape
    if not packed.buckets:  # every row fully padded: nothing to attend
        return query.new_zeros(rows, hidden)
    outputs = []
    for bucket in packed.buckets:
        shape = (bucket.num_seqs, bucket.length, module.num_heads, hidden // module.num_heads)
        q, k, v = (x[bucket.rows].view(shape).transpose(1, 2) for x in (query, key, value))  # (n, A, L, D)
        context, _ = attend(module, q, k, v, bucket.key_mask, scaling=module.scaling, dropout=dropout)  # (n, L, A, D)
        outputs.append(context.reshape(bucket.num_seqs * bucket.length, hidden))  # (n * L, H)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # (R, H)


def labelled_tokens(
    hidden_states: torch.Tensor, labels: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLM prediction: keep only the positions that carry a label.

    hidden_states (B, S, H), labels (B, S) with `ignore_index` (the model's `IGNORE_INDEX`, -100)
    = no label -> (N, H) and their labels (N,), in row-major order. The MLM head then runs on N
    rows instead of B * S (about 15% of them in BERT pretraining), and the mean cross-entropy over
    the N rows equals the dense one, which ignores those positions anyway.
    """
    labels = labels.to(hidden_states.device)
    chosen = (labels != ignore_index).reshape(-1).nonzero().squeeze(1)  # (N,)
    flat = hidden_states.reshape(-1, hidden_states.size(-1))  # (B * S, H)
    return flat.index_select(0, chosen), labels.reshape(-1).index_select(0, chosen)
