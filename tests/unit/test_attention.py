"""Flash attention chosen by measurement: the rule, where the choice is free, the kept verdicts."""

from __future__ import annotations

from pathlib import Path

from edge.runtime.llama import attention
from edge.runtime.llama.attention import AttnTiming, choose, fixed_choice, free_choice

# the 2-core Sapphire Rapids VM of the module docstring, Qwen2.5 0.5B, 384 cells deep
ON = AttnTiming(True, prompt_token_s=0.00461, step_s=0.0401, verify_s=0.1529)
OFF = AttnTiming(False, prompt_token_s=0.00479, step_s=0.0363, verify_s=0.1050)


def test_the_cheaper_nominal_request_wins() -> None:
    assert OFF.request_s() < ON.request_s()
    assert choose(ON, OFF) is OFF
    # prompts dominate where steps cost the same: flash attention's faster prompt wins
    flat_off = AttnTiming(False, prompt_token_s=0.006, step_s=0.0401, verify_s=0.1529)
    assert choose(ON, flat_off) is ON


def test_near_a_tie_flash_attention_stays() -> None:
    a_bit_cheaper = AttnTiming(False, ON.prompt_token_s, ON.step_s * 0.99, ON.verify_s * 0.99)
    assert a_bit_cheaper.request_s() < ON.request_s()
    assert choose(ON, a_bit_cheaper) is ON  # within OFF_MARGIN: not worth its larger buffer


def test_verify_steps_count_only_when_speculating() -> None:
    no_spec = AttnTiming(True, 0.004, 0.040)
    assert no_spec.request_s() == attention.NOMINAL_PROMPT * 0.004 + attention.NOMINAL_STEPS * 0.040
    spec = AttnTiming(True, 0.004, 0.040, 0.120)
    assert spec.request_s() == attention.NOMINAL_PROMPT * 0.004 + attention.NOMINAL_STEPS * 0.080


def test_edge_measures_only_where_the_choice_is_free() -> None:
    assert free_choice("fastest", n_gpu_layers=0, kv_type="f16", off_fits=True)
    assert not free_choice("on", 0, "f16", True) and not free_choice("off", 0, "f16", True)
    assert not free_choice("auto", 0, "f16", True)  # the default: llama.cpp's, repeatable greedy output
    assert not free_choice("fastest", 33, "f16", True)  # GPU: llama.cpp's own auto
    assert not free_choice("fastest", 0, "q8_0", True)  # a quantized V cache needs flash attention
    assert not free_choice("fastest", 0, "f16", False)  # the plan has no room for the K·Q buffer
    assert fixed_choice("on") is True and fixed_choice("off") is False and fixed_choice("auto") is None
    assert fixed_choice("fastest") is None


def test_verdicts_are_kept_per_key_and_survive_a_bad_file(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    key = attention.verdict_key(str(model), "AVX2 = 1", 2, 9)
    assert attention.load_verdict(key, tmp_path) is None
    attention.save_verdict(key, OFF, tmp_path)
    assert attention.load_verdict(key, tmp_path) == OFF
    # another thread count, build or verify length is another question
    assert attention.verdict_key(str(model), "AVX2 = 1", 1, 9) != key
    assert attention.verdict_key(str(model), "AMX_INT8 = 1", 2, 9) != key
    assert attention.verdict_key(str(model), "AVX2 = 1", 2, 0) != key
    other = attention.verdict_key(str(model), "AVX2 = 1", 1, 9)
    attention.save_verdict(other, ON, tmp_path)
    assert attention.load_verdict(key, tmp_path) == OFF and attention.load_verdict(other, tmp_path) == ON
    (tmp_path / attention.VERDICTS_FILE).write_text("not json")
    assert attention.load_verdict(key, tmp_path) is None  # measured again, never a crash
    attention.save_verdict(key, ON, tmp_path)
    assert attention.load_verdict(key, tmp_path) == ON


def test_an_unwritable_cache_only_means_measuring_again(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    attention.save_verdict("k", ON, blocker / "sub")  # a file where the directory would be
    assert attention.load_verdict("k", blocker / "sub") is None
