"""Shape, parameter-count and causality checks of the transformer LM."""

import pytest
import torch

from models.config import LMConfig
from models.flops import lm_param_count
from models.transformer import TransformerLM, count_params


def test_paper_parameter_count_d512_l8():
    cfg = LMConfig(d_model=512, vocab_size=32000)
    assert cfg.n_layers == 8
    assert lm_param_count(512, 8, 32000) == 57_950_720
    assert count_params(TransformerLM(cfg)) == 57_950_720


@pytest.mark.parametrize(
    "options", [{}, {"mlp": "swiglu"}, {"tie_embeddings": True}, {"n_layers": 3, "mlp_ratio": 2}]
)
def test_counted_parameters_match_the_model(options):
    cfg = LMConfig(d_model=128, vocab_size=300, seq_len=16, **options)
    assert count_params(TransformerLM(cfg)) == cfg.param_count()


def test_modules_are_the_plain_ones_mx_swaps():
    model = TransformerLM(LMConfig(d_model=64, vocab_size=50, seq_len=8))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert all(m.bias is None for m in linears + norms)
    # Per layer: attn norm, mlp norm, q norm, k norm; plus the final norm.
    assert len(norms) == 4 * model.cfg.n_layers + 1
    assert any(isinstance(m, torch.nn.GELU) for m in model.modules())


def test_logits_shape_and_causality():
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(d_model=64, n_layers=2, vocab_size=40, seq_len=12))
    tokens = torch.randint(0, 40, (3, 12))
    logits = model(tokens)
    assert logits.shape == (3, 12, 40)
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 40
    other = model(changed)
    torch.testing.assert_close(logits[:, :7], other[:, :7], rtol=0, atol=0)
    assert (logits[:, 7:] - other[:, 7:]).abs().max() > 1e-4


def test_initial_loss_is_near_uniform_and_long_inputs_are_refused():
    torch.manual_seed(0)
    model = TransformerLM(LMConfig(d_model=64, vocab_size=200, seq_len=16))
    loss = model.loss(torch.randint(0, 200, (4, 17))).item()
    assert abs(loss - torch.log(torch.tensor(200.0)).item()) < 0.1
    with pytest.raises(ValueError, match="exceeds model seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
