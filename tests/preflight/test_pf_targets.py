"""Target modules, trainable parameters, embedding size (docs/PROTOCOL.md step 4, docs/CASES.md C5, C6)."""

import json

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

from tuneproof.models.targets import match_target_modules, trainable_summary
from tuneproof.preflight.targets import check_embedding_size


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    return LlamaForCausalLM(cfg)


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    cfg = BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=100,
        max_position_embeddings=64,
        num_labels=2,
    )
    return BertForSequenceClassification(cfg)


def test_c5_pattern_matching_nothing_fails_and_names_it():
    r = match_target_modules(tiny_llama(), ["q_proj", "ff.0"])
    json.dumps(r)
    assert r["passed"] is False
    assert r["patterns"]["q_proj"]["count"] == 2
    assert r["patterns"]["q_proj"]["groups"] == {"model.layers.*.self_attn.q_proj": 2}
    assert r["patterns"]["q_proj"]["types"] == {"Linear": 2}
    assert r["patterns"]["ff.0"]["count"] == 0
    assert r["unmatched"] == ["ff.0"]
    assert "'ff.0' matches no module of LlamaForCausalLM" in r["message"]
    assert "q_proj: 2, ff.0: 0" in r["message"]
    assert {"gate_proj", "up_proj", "down_proj"} <= set(r["available"])


def test_matching_agrees_with_peft():
    model = tiny_llama()
    r = match_target_modules(model, ["q_proj", "v_proj"])
    assert r["passed"] and r["total_matched"] == 4
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    wrapped = {n.removeprefix("base_model.model.") for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == set(r["patterns"]["q_proj"]["matches"]) | set(r["patterns"]["v_proj"]["matches"])


def test_suffix_is_per_name_component_regex_and_all_linear():
    model = tiny_llama()
    assert match_target_modules(model, ["proj"])["patterns"]["proj"]["count"] == 0  # not a substring match
    r = match_target_modules(model, r"model\.layers\.0\.self_attn\.(q|k)_proj")
    assert r["passed"] and r["total_matched"] == 2
    allr = match_target_modules(model, "all-linear")
    assert allr["total_matched"] == 2 * 7  # q k v o gate up down per layer, lm_head excluded
    assert "lm_head" not in allr["patterns"]["all-linear"]["matches"]


def test_match_on_a_module_lora_cannot_wrap_fails():
    r = match_target_modules(tiny_llama(), ["self_attn"])
    assert r["passed"] is False and r["patterns"]["self_attn"]["count"] == 2
    assert "LlamaAttention" in r["message"] and "cannot wrap" in r["message"]


def test_trainable_summary_counts_lora_elements():
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    s = trainable_summary(model)
    json.dumps(s)
    assert s["passed"] and s["message"].startswith("896 of ")
    # per layer: q A 4x32 + B 32x4 = 256; v A 4x32 + B 16x4 = 192 (2 kv heads x 8 dims)
    assert s["trainable"] == 2 * (256 + 192)
    assert len(s["trainable_tensors"]) == 8
    base_total = sum(p.numel() for p in tiny_llama().parameters())
    assert s["total"] == base_total + s["trainable"]
    assert abs(s["percent"] - 100 * s["trainable"] / s["total"]) < 1e-12
    assert s["modules_to_save"] == [] and s["trainable_dtypes"] == {"float32": 896}


def test_c6_modules_to_save_is_reported():
    model = get_peft_model(
        tiny_bert(),
        LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"], modules_to_save=["classifier"]),
    )
    s = trainable_summary(model)
    assert any(n.endswith("classifier") for n in s["modules_to_save"])
    assert any("classifier.modules_to_save.default.weight" in n for n in s["trainable_tensors"])


def test_embedding_size_against_tokenizer():
    model = tiny_llama()
    assert check_embedding_size(model, 128)["passed"]
    r = check_embedding_size(model, 130)
    assert r["passed"] is False and "resize_token_embeddings" in r["message"] and r["input_embedding_rows"] == 128
    frozen = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"]))
    r = check_embedding_size(frozen, 128, added_tokens=2)
    assert r["passed"] is False and "modules_to_save" in r["message"]
    saved = get_peft_model(
        tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["embed_tokens", "lm_head"])
    )
    r = check_embedding_size(saved, 128, added_tokens=2)
    assert r["passed"] and r["embedding_trainable_or_saved"]


def tiny_t5(seed=0):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    return T5ForConditionalGeneration(
        T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2)
    )


def test_c5_kind_matches_per_tower_and_a_pattern_in_several_towers_warns():
    model = tiny_t5()
    r = match_target_modules(model, ["q", "wi"])
    json.dumps(r)
    assert r["passed"] is True  # a warning, not a failure
    assert r["patterns"]["q"]["towers"] == {"encoder": 2, "decoder": 2, "cross-attention": 2}
    assert r["patterns"]["wi"]["towers"] == {"encoder": 2, "decoder": 2}
    assert "q: 6 (encoder 2, decoder 2, cross-attention 2), wi: 4 (encoder 2, decoder 2)" in r["message"]
    assert r["warnings"] == [
        "target_modules pattern 'q' matches in 3 towers (encoder: 2, decoder: "
        "2, cross-attention: 2): LoRA adapts all of them; "
        "to adapt one tower only, list the full names of its modules in "
        "method.target_modules (a full name matches only itself), "
        "e.g. 'encoder.block.0.layer.0.SelfAttention.q' for the encoder",
        "target_modules pattern 'wi' matches in 2 towers (encoder: 2, decoder: 2): LoRA adapts all of them; "
        "to adapt one tower only, list the full names of its modules in "
        "method.target_modules (a full name matches only itself), "
        "e.g. 'encoder.block.0.layer.1.DenseReluDense.wi' for the encoder",
    ]
    # what PEFT wraps is exactly what was counted, in every tower
    wrapped = {
        n.removeprefix("base_model.model.")
        for n, m in get_peft_model(tiny_t5(), LoraConfig(r=2, target_modules=["q"])).named_modules()
        if hasattr(m, "lora_A")
    }
    assert wrapped == set(r["patterns"]["q"]["matches"])
    # one tower only: the cross-attention by its suffix, the encoder by full names; no warning
    one = match_target_modules(model, ["EncDecAttention.q"])
    assert one["patterns"]["EncDecAttention.q"]["towers"] == {"cross-attention": 2} and one["warnings"] == []
    enc = match_target_modules(model, [f"encoder.block.{i}.layer.0.SelfAttention.q" for i in (0, 1)])
    assert enc["warnings"] == [] and enc["total_matched"] == 2


def test_tower_of_module_paths():
    from tuneproof.models.targets import tower_of

    assert tower_of("model.layers.0.self_attn.q_proj") == "model"  # decoder-only: one tower
    assert tower_of("model.encoder.layers.1.self_attn.q_proj") == "encoder"
    assert tower_of("model.decoder.layers.1.self_attn.q_proj") == "decoder"
    assert tower_of("model.decoder.layers.1.encoder_attn.q_proj") == "cross-attention"  # BART, Whisper, Marian
    assert tower_of("bert.encoder.layer.0.crossattention.self.query") == "cross-attention"
    assert (
        tower_of("vision_tower.vision_model.encoder.layers.0.self_attn.q_proj") == "vision"
    )  # Llava: vision before encoder
    assert tower_of("model.visual.blocks.0.attn.qkv") == "vision"  # Qwen2-VL
    assert tower_of("language_model.model.layers.0.self_attn.q_proj") == "language model"
    assert tower_of("multi_modal_projector.linear_1") == "projector"
    # a single-tower model (7 Linear per layer, embed_tokens, lm_head) reports counts without towers and never warns
    r = match_target_modules(tiny_llama(), ["q_proj", "v_proj"])
    assert r["towers"] == {"model": 2 * 7 + 2} and r["warnings"] == [] and "q_proj: 2, v_proj: 2" in r["message"]


def test_an_encoder_only_model_with_a_head_is_one_tower():
    r = match_target_modules(tiny_bert(), ["query", "dense"])
    assert r["patterns"]["dense"]["towers"] == {
        "encoder": 6,
        "model": 1,
    }  # attention.output, intermediate, output x 2 layers; pooler
    assert r["warnings"] == [] and "query: 2, dense: 7" in r["message"]
