"""The synthetic Markov source, token files and text files."""

import numpy as np
import pytest

from models.config import LMConfig, RunSpec, SyntheticData, TextFileData, TokenFileData, TrainConfig
from models.data import MAX_EXACT_CONTEXTS, MarkovSource, build_data


def _spec(data, vocab=64, seq_len=8, batch=4, seed=0):
    return RunSpec(
        model=LMConfig(d_model=32, head_dim=32, vocab_size=vocab, seq_len=seq_len),
        data=data,
        train=TrainConfig(steps=10, batch_size=batch, eval_batches=2),
        seed=seed,
    )


def test_exact_and_estimated_rates_agree():
    source = MarkovSource(64, 2, 4, 0.5, source_seed=3)
    exact_rate, exact_unigram = source.exact_rates()
    est_rate, est_unigram = source.estimated_rates()
    assert 0.1 < exact_rate < np.log(4)  # at most log(branching) per token
    assert est_rate == pytest.approx(exact_rate, rel=0.01)
    assert est_unigram == pytest.approx(exact_unigram, rel=0.01)


def test_sampled_data_has_the_stated_entropy_rate():
    corpus = build_data(_spec(SyntheticData(order=1, branching=6), vocab=64, seq_len=256, batch=32))
    source = corpus.source
    tokens = np.concatenate([corpus.train_batch(s) for s in range(8)])
    prev, nxt = tokens[:, :-1].ravel(), tokens[:, 1:].ravel()
    rows = source.bucket(prev[:, None])
    match = source.successors[rows] == nxt[:, None]
    assert match.any(axis=1).all()  # every transition is one of the context's successors
    nll = -np.log(source.probs[rows][match]).mean()
    assert nll == pytest.approx(corpus.entropy_rate, rel=0.03)


def test_batches_are_a_function_of_seed_and_step():
    a, b = (build_data(_spec(SyntheticData())) for _ in range(2))
    assert np.array_equal(a.train_batch(37), b.train_batch(37))
    assert not np.array_equal(a.train_batch(37), a.train_batch(38))
    other_seed = build_data(_spec(SyntheticData(), seed=1))
    assert not np.array_equal(a.train_batch(3), other_seed.train_batch(3))
    assert a.train_batch(5).shape == (4, 9) and len(a.val_batches()) == 2


def test_large_context_space_is_hashed():
    source = MarkovSource(2048, 2, 8, 0.5, source_seed=0)
    assert source.hashed and source.n_contexts == MAX_EXACT_CONTEXTS
    tokens, _ = source.sample(np.random.default_rng(0), 4, 50)
    assert tokens.min() >= 0 and tokens.max() < 2048


def test_branching_larger_than_vocab_is_refused():
    with pytest.raises(ValueError, match="branching=9 exceeds vocab_size=8"):
        MarkovSource(8, 1, 9, 0.5, 0)


def _write_tokens(path, tokens, dtype="uint16"):
    np.asarray(tokens, dtype=dtype).tofile(path)
    return str(path)


def test_token_files_cover_every_window_once_per_epoch(tmp_path):
    train = [
        _write_tokens(tmp_path / "a.bin", np.arange(45) % 60),
        _write_tokens(tmp_path / "b.bin", 10 + np.arange(27) % 50),
    ]
    val = [_write_tokens(tmp_path / "v.bin", np.arange(20))]
    corpus = build_data(_spec(TokenFileData(train=train, validation=val), seq_len=8, batch=2))
    # 45 // 9 + 27 // 9 = 8 windows = 4 steps per epoch.
    epoch = np.concatenate([corpus.train_batch(s) for s in range(4)])
    starts = sorted(map(tuple, epoch[:, :2].tolist()))
    expected = sorted(
        [(i, i + 1) for i in range(0, 45, 9)] + [(10 + i, 11 + i) for i in (0, 9, 18)]
    )
    assert starts == expected
    assert np.array_equal(
        build_data(
            _spec(TokenFileData(train=train, validation=val), seq_len=8, batch=2)
        ).train_batch(5),
        corpus.train_batch(5),
    )
    assert np.array_equal(corpus.val_batches()[0][0], np.arange(9))


def test_missing_token_file_names_the_file(tmp_path):
    data = TokenFileData(train=[str(tmp_path / "nope.bin")], validation=[str(tmp_path / "v")])
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        build_data(_spec(data))


def test_corrupt_token_files_name_the_file(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    good = _write_tokens(tmp_path / "good.bin", np.arange(40) % 60)
    with pytest.raises(ValueError, match="odd.bin.*not a multiple"):
        build_data(_spec(TokenFileData(train=[str(odd)], validation=[good])))
    big = _write_tokens(tmp_path / "big.bin", np.full(40, 1000))
    corpus = build_data(_spec(TokenFileData(train=[good], validation=[big])))
    with pytest.raises(ValueError, match="big.bin: token id 1000.*vocab_size=64"):
        corpus.val_batches()


def test_text_files_are_bytes_and_bad_text_is_refused(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world, " * 10)
    corpus = build_data(_spec(TextFileData(train=[str(text)], validation=[str(text)]), vocab=256))
    assert bytes(corpus.val_batches()[0][0].astype(np.uint8)) == b"hello wor"
    assert 0 < corpus.unigram_entropy() < np.log(256)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe" * 20)
    with pytest.raises(ValueError, match="bad.txt is not valid UTF-8"):
        build_data(_spec(TextFileData(train=[str(bad)], validation=[str(text)]), vocab=256))
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        build_data(_spec(TextFileData(train=[str(text)], validation=[str(text)]), vocab=64))
