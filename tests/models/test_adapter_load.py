"""Loading an adapter for judging (eval, the fresh-process reload, ``verify``): every tensor of the file
loads into the model and every adapter tensor of the model comes from the file, by PEFT's load result;
tensor names under another module prefix are refused naming the unmatched keys."""

from __future__ import annotations

import pytest
import torch

from tinymodels import make_llama
from tuneproof.errors import CheckFailed
from tuneproof.models.method import load_adapter_onto


def _saved_adapter(folder, prefix: str | None = None):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    model = get_peft_model(make_llama(64), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    model.save_pretrained(folder)
    if prefix:
        path = folder / "adapter_model.safetensors"
        tensors = load_file(str(path))
        save_file({k.replace("base_model.model.", prefix): v for k, v in tensors.items()}, str(path))
    return model


def test_an_adapter_loads_with_every_tensor_matched(tmp_path):
    trained = _saved_adapter(tmp_path / "ok")
    loaded = load_adapter_onto(make_llama(64), tmp_path / "ok")
    ids = torch.tensor([[1, 5, 9, 3]])
    assert not loaded.training
    assert torch.equal(loaded(ids).logits, trained.eval()(ids).logits)


@pytest.mark.fault("tampering: adapter tensor names under another module prefix")
def test_tensor_names_under_another_prefix_are_refused_naming_the_keys(tmp_path):
    _saved_adapter(tmp_path / "bad", prefix="base_model.model.encoder.")
    with pytest.raises(CheckFailed) as err:
        load_adapter_onto(make_llama(64), tmp_path / "bad")
    said = str(err.value)
    assert said.startswith(
        f"the adapter {tmp_path / 'bad'} does not match the model: 4 tensors of the model are not "
        "in the file (base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight, "
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight (+2 more)); 4 tensors of the file "
        "match no module of the model (base_model.model.encoder.model.layers.0.self_attn.q_proj.lora_A.weight, "
        "base_model.model.encoder.model.layers.0.self_attn.q_proj.lora_B.weight (+2 more))"
    )


@pytest.mark.fault("tampering: saved model tensor names under another module prefix")
def test_a_saved_full_model_under_another_prefix_is_refused_a_base_head_is_not(tmp_path):
    from safetensors.torch import load_file, save_file

    from tuneproof.modalities.text import CAUSAL_LM
    from tuneproof.models.base_model import BaseModelRef, load_model

    make_llama(64).save_pretrained(tmp_path)
    ref = BaseModelRef("run", tmp_path, "local", "causal-lm", "run")
    assert load_model(ref, CAUSAL_LM, saved=True).config.vocab_size == 64  # every tensor matched
    path = tmp_path / "model.safetensors"
    save_file({"other." + k: v for k, v in load_file(str(path)).items()}, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckFailed) as err:
        load_model(ref, CAUSAL_LM, saved=True)
    assert str(err.value).startswith(
        f"the saved model {tmp_path} does not match the model: 21 tensors of the model are not in the file "
        "(lm_head.weight, model.embed_tokens.weight (+19 more)); 21 tensors of the file match no module of the "
        "model (other.lm_head.weight, other.model.embed_tokens.weight (+19 more))"
    )
