"""The GPU path: what this project's CPU-only machines (and CI) cannot check.

Every test here skips without a CUDA device. On a machine with one (`pytest tests/test_gpu.py -s`):
- parity with transformers on the GPU, real weights (rxnfp: MLM and NSP heads), fp32, with the
  CPU parity tests' tolerances (tests/test_parity.py), padded batch and token types;
- the same model on GPU and CPU agrees to those tolerances (a checkpoint moves between them);
- bf16 and fp16 autocast on the GPU stay within the bf16 tolerances of tests/test_bf16.py
  against fp32: relative error <= 2%, every real token's cosine >= 0.999;
- the pretrain command trains on the GPU in fp32, bf16 and fp16 (fp16 with a gradient scaler),
  and what it saves loads on the CPU with the GPU's outputs.
The rest of the suite runs on the GPU by itself there: the pretrain and finetune tests take
Accelerate's and Trainer's device, which is the GPU where one is present.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import TINY_PRETRAIN, documentation_corpus, run_config_maker, run_log, saved_tokenizer
from test_bf16 import INFERENCE_REL, MIN_COSINE
from test_parity import assert_parity, load_pair, logits_tolerance, rxnfp_batch

from scratchbert import ScratchBertForPreTraining
from scratchbert.training.pretraining.loop import pretrain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: these tests check the GPU path")

GPU = torch.device("cuda")


def on(device: torch.device, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in batch.items()}


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_rxnfp_every_pretraining_head_matches_transformers_on_the_gpu(rxnfp_dir, attn_implementation):
    ours, theirs = load_pair(ScratchBertForPreTraining, transformers.BertForPreTraining, rxnfp_dir, attn_implementation)
    ours, theirs = ours.to(GPU), theirs.to(GPU)
    batch, labels = rxnfp_batch(rxnfp_dir)
    batch, labels, nsp = on(GPU, batch), labels.to(GPU), torch.tensor([0, 1, 0, 1], device=GPU)
    with torch.no_grad():
        a = ours(**batch, labels=labels, next_sentence_label=nsp)
        b = theirs(**batch, labels=labels, next_sentence_label=nsp)
    tag = f"rxnfp/{attn_implementation}/cuda"
    keep = batch["attention_mask"]
    assert_parity(f"{tag} MLM logits", a.prediction_logits, b.prediction_logits, logits_tolerance(b.prediction_logits), keep)
    assert_parity(f"{tag} NSP logits", a.seq_relationship_logits, b.seq_relationship_logits)
    assert_parity(f"{tag} loss", a.loss, b.loss)
    masked = labels != -100
    assert torch.equal(a.prediction_logits.argmax(-1)[masked], b.prediction_logits.argmax(-1)[masked])


def test_the_same_weights_give_the_same_outputs_on_gpu_and_cpu(rxnfp_dir):
    model = ScratchBertForPreTraining.from_pretrained(rxnfp_dir).eval()
    batch, _ = rxnfp_batch(rxnfp_dir)
    with torch.no_grad():
        cpu = model(**batch)
        gpu = model.to(GPU)(**on(GPU, batch))
    keep = batch["attention_mask"]
    reference = cpu.prediction_logits
    assert_parity("rxnfp MLM logits cuda vs cpu", gpu.prediction_logits.cpu(), reference, logits_tolerance(reference), keep)
    assert_parity("rxnfp NSP logits cuda vs cpu", gpu.seq_relationship_logits.cpu(), cpu.seq_relationship_logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_autocast_on_the_gpu_stays_within_the_bf16_tolerance(rxnfp_dir, attn_implementation, dtype):
    model = ScratchBertForPreTraining.from_pretrained(rxnfp_dir, attn_implementation=attn_implementation).eval().to(GPU)
    batch, _ = rxnfp_batch(rxnfp_dir)
    batch = on(GPU, batch)
    keep = batch["attention_mask"].bool()
    with torch.no_grad():
        reference = model.bert(**batch).last_hidden_state[keep]  # (real tokens, H)
        with torch.autocast("cuda", dtype=dtype):
            hidden = model.bert(**batch).last_hidden_state.float()[keep]
    assert torch.isfinite(hidden).all()
    error = ((hidden - reference).norm() / reference.norm()).item()
    cosine = F.cosine_similarity(hidden, reference, dim=-1).min().item()
    print(f"GPU {attn_implementation} {dtype}: relative error {error:.4f}, lowest token cosine {cosine:.5f}")
    assert error <= INFERENCE_REL["autocast"] and cosine >= MIN_COSINE


@pytest.fixture(scope="module")
def gpu_run_config(tmp_path_factory):
    corpus = documentation_corpus(tmp_path_factory, 36)
    return run_config_maker(TINY_PRETRAIN, corpus, saved_tokenizer(tmp_path_factory, corpus, vocab_size=400))


@pytest.mark.usefixtures("fresh_accelerator_state")
@pytest.mark.parametrize("mixed_precision", ["no", "bf16", "fp16"])
def test_pretraining_on_the_gpu_saves_a_model_the_cpu_loads(gpu_run_config, tmp_path, mixed_precision):
    output_dir = tmp_path / mixed_precision
    pretrain(gpu_run_config(output_dir, mixed_precision=mixed_precision, max_steps=24, eval_every=8))
    records = run_log(output_dir)
    assert records[0]["device"].startswith("cuda"), records[0]
    losses = [record["loss"] for record in records if record.get("type") == "train"]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4, f"{mixed_precision}: the loss did not fall ({losses[:4]} ... {losses[-4:]})"

    saved = ScratchBertForPreTraining.from_pretrained(output_dir).eval()
    ids = torch.randint(5, saved.config.vocab_size, (2, 16))
    with torch.no_grad():
        cpu = saved(input_ids=ids).prediction_logits
        gpu = saved.to(GPU)(input_ids=ids.to(GPU)).prediction_logits.cpu()
    assert_parity(f"pretrained in {mixed_precision} on cuda, MLM logits cuda vs cpu", gpu, cpu, logits_tolerance(cpu))
