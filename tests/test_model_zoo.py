"""The model zoo: every models/*.arch has its published parameter count, compiles, and round-trips.

Expected numbers are published figures (paper, torchvision, Hugging Face model card) or arithmetic
from the published configuration, never irc's own output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from irc.analysis.params import count_params, weight_table
from irc.cli import main
from irc.ir_parser import parse_ir
from irc.pipeline import load_graph
from irc.printer import print_graph

MODELS = Path(__file__).resolve().parents[1] / "models"
ZOO = sorted(p.stem for p in MODELS.glob("*.arch"))

# LSTM LM, Zaremba et al. 2014 "medium": vocab 10,000, 650 units, 2 layers, untied decoder.
# Per layer the chapter's 4·(d_in·h + h² + h) — one bias vector per gate, as irc's lstm keeps.
ZAREMBA_VOCAB, ZAREMBA_H, ZAREMBA_LAYERS = 10_000, 650, 2
ZAREMBA_PARAMS = (ZAREMBA_VOCAB * ZAREMBA_H                                           # embedding
                  + ZAREMBA_LAYERS * 4 * (ZAREMBA_H * ZAREMBA_H + ZAREMBA_H**2 + ZAREMBA_H)  # LSTM
                  + ZAREMBA_H * ZAREMBA_VOCAB + ZAREMBA_VOCAB)                        # decoder

PUBLISHED: dict[str, int] = {
    # Han et al. 2015 (Table 1, "267K"): 784·300+300 + 300·100+100 + 100·10+10
    "mlp": 266_610,
    # torchvision.models.vgg16 (model card: num_params 138,357,544)
    "vgg16": 138_357_544,
    # torchvision.models.resnet18 (model card: num_params 11,689,512)
    "resnet18": 11_689_512,
    # Zaremba et al. 2014, medium configuration, by the formula above: 19,775,200
    "lstm_lm": ZAREMBA_PARAMS,
    # HF "gpt2" model card: 124,439,808 (124M)
    "gpt2_small": 124_439_808,
    # HF "bert-base-uncased", BertModel with pooler: 109,482,240 (110M)
    "bert_base": 109_482_240,
    # HF "meta-llama/Llama-2-7b-hf": 6,738,415,616
    "llama2_7b": 6_738_415_616,
    # HF "mistralai/Mistral-7B-v0.1": 7,241,732,096
    "mistral_7b": 7_241_732_096,
    # HF "t5-small": 60,506,624 (shared embedding counted once; the head is tied to it)
    "t5_small": 60_506_624,
    # torchvision.models.mobilenet_v2 (model card: num_params 3,504,872)
    "mobilenet_v2": 3_504_872,
    # torchvision.models.efficientnet_b0 (model card: num_params 5,288,548)
    "efficientnet_b0": 5_288_548,
    # torchvision.models.convnext_tiny (model card: num_params 28,589,128)
    "convnext_tiny": 28_589_128,
    # torchvision.models.vit_b_16 (model card: num_params 86,567,656)
    "vit_b_16": 86_567_656,
    # torchvision.models.densenet121 (model card: num_params 7,978,856)
    "densenet121": 7_978_856,
    # milesial Pytorch-UNet, UNet(n_channels=3, n_classes=2, bilinear=False): 31,037,698 (its README's 31.04M)
    "unet": 31_037_698,
    # HF "openai/whisper-tiny" WhisperEncoder: 8,208,384, less its frozen 1,500 × 384 sinusoidal table
    # (embed_positions, requires_grad False), which irc's positional computes: 7,632,384
    "whisper_tiny_encoder": 8_208_384 - 1500 * 384,
    # HF "mistralai/Mixtral-8x7B-v0.1": 46,702,792,704 (46.7B; 12.9B active: tests/test_zoo_moe.py)
    "mixtral_8x7b": 46_702_792_704,
    # HF "deepseek-ai/DeepSeek-V2-Lite": 15,706,484,224 (15.7B; 2.4B activated: tests/test_zoo_moe.py)
    "deepseek_v2_lite": 15_706_484_224,
    # irc train's digits CNN (docs/training.md): conv1 320 + conv2 18,496 + fc1 32,896 + logits 1,290
    "digits_cnn": 53_002,
    # irc train's byte-level transformer: 256·64 + 64·64 + 2·(12·64² + 13·64) + 128
    "byte_lm": 120_576,
}

# torchvision resnet18 state_dict, minus its 20 num_batches_tracked counters: 11,699,112 elements.
RESNET18_WITH_RUNNING_STATS = 11_699_112


def test_every_zoo_model_has_a_published_count() -> None:
    assert ZOO == sorted(PUBLISHED)


def test_zaremba_medium_by_the_formula() -> None:
    assert ZAREMBA_PARAMS == 19_775_200


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_count(name: str) -> None:
    params, _ = count_params(load_graph(MODELS / f"{name}.arch"))
    assert params == PUBLISHED[name]


def test_resnet18_buffers_are_batchnorm_running_stats() -> None:
    params, buffers = count_params(load_graph(MODELS / "resnet18.arch"))
    assert params + buffers == RESNET18_WITH_RUNNING_STATS
    # running_mean and running_var per BN channel: stem 64; stages 4·64, 5·128, 5·256, 5·512
    assert buffers == 2 * (64 + 4 * 64 + 5 * 128 + 5 * 256 + 5 * 512)


def test_lstm_lm_against_torch_two_bias_convention() -> None:
    import torch  # a test dependency (pyproject [test]); imported here to keep collection fast

    with torch.device("meta"):
        modules = [torch.nn.Embedding(ZAREMBA_VOCAB, ZAREMBA_H),
                   torch.nn.LSTM(ZAREMBA_H, ZAREMBA_H, ZAREMBA_LAYERS, batch_first=True),
                   torch.nn.Linear(ZAREMBA_H, ZAREMBA_VOCAB)]
    torch_count = sum(p.numel() for m in modules for p in m.parameters())
    params, _ = count_params(load_graph(MODELS / "lstm_lm.arch"))
    # nn.LSTM keeps bias_ih and bias_hh; irc keeps their sum: 4·h fewer per layer
    assert torch_count - params == ZAREMBA_LAYERS * 4 * ZAREMBA_H


def _shapes(name: str) -> dict[str, tuple]:
    return weight_table(load_graph(MODELS / f"{name}.arch"))[0]


def test_published_configurations_show_in_weight_shapes() -> None:
    t5 = _shapes("t5_small")
    # one relative-position table of 32 buckets × 8 heads per stack (HF: block 0's relative_attention_bias)
    assert sorted((k, s) for k, s in t5.items() if "pos" in k) == [("decoder_pos.weight", (32, 8)),
                                                                  ("encoder_pos.weight", (32, 8))]
    mistral = _shapes("mistral_7b")
    assert mistral["llama_decoder.0.attn.wk"] == (8 * 128, 4096)  # 8 KV heads of 128
    assert mistral["llama_decoder.31.mlp.w_gate"] == (14_336, 4096)
    llama = _shapes("llama2_7b")
    assert llama["llama_decoder.0.mlp.w_up"] == (11_008, 4096)  # round_up(8·4096/3, 256)
    assert llama["lm_head.weight"] == (32_000, 4096)  # untied
    gpt2 = _shapes("gpt2_small")
    assert [k for k, s in gpt2.items() if s == (50_257, 768)] == ["wte.weight"]  # tied head
    bert = _shapes("bert_base")
    assert bert["pooler.weight"] == (768, 768) and bert["token_type_embeddings.weight"] == (2, 768)


@pytest.mark.parametrize("name", ZOO)
def test_compiles_from_the_command_line(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.ir"
    assert main(["compile", str(MODELS / f"{name}.arch"), "-o", str(out)]) == 0
    assert out.read_text().startswith("// irc IR")


@pytest.mark.parametrize("bindings", [{}, {"B": 2}], ids=["symbolic", "bound"])
@pytest.mark.parametrize("name", ZOO)
def test_printed_ir_round_trips(name: str, bindings: dict[str, int]) -> None:
    graph = load_graph(MODELS / f"{name}.arch", bindings)
    for with_loc in (True, False):
        text = print_graph(graph, with_loc)
        again = parse_ir(text, f"{name}.ir")
        assert print_graph(again, with_loc) == text
        assert count_params(again) == count_params(graph)


# The standard library (frontends/arch/lib/transformer.arch) block by block, at d = 64, 4 heads,
# against the chapter's per-block arithmetic: attention 4d² (+4d biases), FFN 2·d·ff (+ff+d).
D, HEADS, FF = 64, 4, 256
ATTN, ATTN_B = 4 * D * D, 4 * D
FFN, FFN_B = 2 * D * FF, FF + D
LIB_BLOCKS = {
    "pre_ln_encoder(x, heads=4, ff=256)": ATTN + ATTN_B + FFN + FFN_B + 2 * 2 * D,
    "pre_ln_decoder(x, heads=4, ff=256)": ATTN + ATTN_B + FFN + FFN_B + 2 * 2 * D,
    "post_ln_encoder(x, heads=4, ff=256)": ATTN + ATTN_B + FFN + FFN_B + 2 * 2 * D,
    "post_ln_decoder(x, heads=4, ff=256)": ATTN + ATTN_B + FFN + FFN_B + 2 * 2 * D,
    "cross_decoder(x, mem, heads=4, ff=256)": 2 * (ATTN + ATTN_B) + FFN + FFN_B + 3 * 2 * D,
    "llama_decoder(x, heads=4, ff=256)": ATTN + 3 * D * FF + 2 * D,
    # GQA with 1 KV head of 16: wk and wv shrink to 16 × 64 each
    "llama_decoder(x, heads=4, kv_heads=1, ff=256)": 2 * D * D + 2 * 16 * D + 3 * D * FF + 2 * D,
    "t5_encoder(x, rel_position_bias(x, heads=4), heads=4, ff=256)": ATTN + FFN + 2 * D + 32 * HEADS,
    "t5_decoder(x, mem, rel_position_bias(x, heads=4, bidirectional=false), heads=4, ff=256)":
        2 * ATTN + FFN + 3 * D + 32 * HEADS,
}


@pytest.mark.parametrize("call", sorted(LIB_BLOCKS))
def test_standard_library_block(call: str, tmp_path: Path) -> None:
    src = tmp_path / "one_block.arch"
    src.write_text('use "transformer.arch"\n'
                   "model one(B, T, S) {\n"
                   "  input x: f32[B, T, 64]\n"
                   "  input mem: f32[B, S, 64]\n"
                   f"  output y = {call}\n"
                   "}\n")
    params, _ = count_params(load_graph(src))
    assert params == LIB_BLOCKS[call]
