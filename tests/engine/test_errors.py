"""Bad input gets a clear error, never a silent wrong sample."""

import functools
import types

import pytest
import torch

from pyro_autospec.engine import OracleError, Schedule, sample_any_order
from pyro_autospec.engine.diffusion import sample_sde
from pyro_autospec.engine.errors import check_eval_mode
from pyro_autospec.oracles import MarkovChainOracle
from pyro_autospec.oracles.tabular import TabularOracle


def good_table():
    return torch.tensor([[0.4, 0.1], [0.2, 0.3]], dtype=torch.float64).log()


class Wrapped:
    """A full-row oracle whose output passes through ``corrupt``."""

    def __init__(self, corrupt, num_coords=2, num_values=2):
        self.inner = TabularOracle(logits=good_table())
        self.corrupt = corrupt
        self.num_coords = num_coords
        self.num_values = num_values

    def log_marginals(self, values, mask):
        return self.corrupt(self.inner.log_marginals(values[:, :2], mask[:, :2]))


def with_nan(out):
    out = out.clone()
    out[:, :, 0] = float("nan")
    return out


def unnormalised(out):
    return out + 0.3


def no_mass(out):
    return torch.full_like(out, -float("inf"))


def plus_inf(out):
    out = out.clone()
    out[:, :, 1] = float("inf")
    return out


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (with_nan, "contains NaN"),
        (unnormalised, "sums to 1.34985880758 instead of 1"),
        (no_mass, "gives zero mass to every value"),
        (plus_inf, "contains +inf"),
    ],
)
@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_bad_rows(corrupt, message, method):
    with pytest.raises(OracleError, match=message.replace("+", r"\+")):
        sample_any_order(Wrapped(corrupt), 3, seed=0, method=method)


def test_wrong_shape_and_inconsistent_sizes():
    with pytest.raises(OracleError, match=r"returned shape \(\d+, 2, 2\).*expected \(\d+, 3, 2\)"):
        sample_any_order(Wrapped(lambda out: out, num_coords=3), 2, seed=0)
    with pytest.raises(OracleError, match="num_values"):
        sample_any_order(Wrapped(lambda out: out, num_values=3), 2, seed=0)


def test_wrong_dtype_and_type():
    with pytest.raises(OracleError, match="floating point"):
        sample_any_order(Wrapped(lambda out: out.long()), 2, seed=0)
    with pytest.raises(OracleError, match="torch.Tensor"):
        sample_any_order(Wrapped(lambda out: out.numpy()), 2, seed=0)


def test_not_an_oracle():
    with pytest.raises(TypeError, match="num_coords"):
        sample_any_order(object(), 2)

    class NoMethod:
        num_coords, num_values = 2, 2

    with pytest.raises(TypeError, match="log_marginals"):
        sample_any_order(NoMethod(), 2)


@pytest.mark.parametrize(
    "size, message",
    [
        (True, r"num_coords must be an int; got True\."),
        (torch.tensor(2), r"got tensor\(2\) \(convert it: int\(oracle\.num_coords\)\)"),
    ],
)
def test_sizes_that_are_not_ints_are_named(size, message):
    """A bool is no size (``True`` read as n = 1 failed later inside the oracle), and a torch
    scalar is told how to convert."""
    oracle = Wrapped(lambda out: out)
    oracle.num_coords = size
    with pytest.raises(TypeError, match=message):
        sample_any_order(oracle, 2, seed=0)


def test_bad_arguments():
    oracle = TabularOracle(logits=good_table())
    with pytest.raises(ValueError, match="num_samples"):
        sample_any_order(oracle, 0)
    with pytest.raises(ValueError, match="method must be one of"):
        sample_any_order(oracle, 2, method="gibbs")
    with pytest.raises(ValueError, match="permutation"):
        sample_any_order(oracle, 2, order=[0, 0])
    with pytest.raises(ValueError, match="order must be 'random'"):
        sample_any_order(oracle, 2, order="sorted")
    with pytest.raises(TypeError, match="unknown schedule knobs"):
        sample_any_order(oracle, 2, rhoo=1.0)
    for rho in (0.0, float("inf"), float("nan"), "fast", True):
        with pytest.raises(ValueError, match="rho must be a finite number"):
            sample_any_order(oracle, 2, schedule=Schedule(rho=rho))
    with pytest.raises(TypeError, match="seed"):
        sample_any_order(oracle, 2, seed="abc")


def test_impossible_prefix_rows_are_not_errors():
    """Rows conditioned on a zero-probability drafted prefix may be NaN: they are ignored."""
    table = torch.zeros(2, 2, 2, dtype=torch.float64)
    table[0, 0, 0] = table[1, 1, 1] = 1.0  # x0 = x1 = x2: drafts are often impossible
    oracle = TabularOracle(probs=table)  # returns NaN rows on impossible conditionings
    result = sample_any_order(oracle, 200, seed=0)
    assert ((result.samples == result.samples[:, :1]).all(1)).all()


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_row_check_flags_every_bad_row(device, dtype):
    # The check reads only logsumexp of a row: NaN and +inf must propagate through it on
    # every device, next to -inf, finite and other non-finite entries.
    from pyro_autospec.engine.rows import _checked

    inf, nan = float("inf"), float("nan")
    rows = [
        ([nan, -inf], True),
        ([-inf, nan], True),
        ([nan, inf], True),
        ([inf, nan], True),
        ([inf, -inf], True),
        ([inf, inf], True),
        ([0.0, nan], True),
        ([-inf, -inf], True),  # no mass
        ([0.0, 0.0], True),  # sums to 2
        ([0.0, -inf], False),
        ([-0.6931471805599453, -0.6931471805599453], False),
    ]
    out = torch.tensor([[r] for r, _ in rows], dtype=dtype, device=device)  # [R, 1, 2]
    valid = torch.ones(len(rows), 1, dtype=torch.bool, device=device)
    answer = _checked(out, valid)
    assert answer.bad[:, 0].tolist() == [bad for _, bad in rows]
    assert not _checked(out, torch.zeros_like(valid)).bad.any()  # padding is never bad


class Float32Rows:
    """A user oracle that computes in float32 and hands back float64 (rounding ~1e-7)."""

    num_coords, num_values = 12, 5

    def __init__(self):
        self.logits = torch.randn(12, 5, generator=torch.Generator().manual_seed(3)) * 2

    def log_marginals(self, values, mask):
        rows = torch.log_softmax(self.logits.float(), -1)
        return rows.expand(values.shape[0], -1, -1).double()


def test_float32_rounding_in_a_float64_row_is_accepted_and_renormalised():
    result = sample_any_order(Float32Rows(), 4, seed=0)
    assert result.samples.shape == (4, 12)


class OtherDevice:
    num_coords, num_values = 5, 2

    def log_marginals(self, values, mask):
        return torch.full((values.shape[0], 5, 2), 0.5).log().to("meta")


def test_output_on_another_device_is_named():
    with pytest.raises(OracleError, match="returned a tensor on meta, but its inputs are on cpu"):
        sample_any_order(OtherDevice(), 2, seed=0)


class BadAfterChain:
    """A Markov chain whose rows after chains (``log_marginals_chain_then``'s second output)
    turn NaN from the ``start``-th call on: a verification's prefetched draft row."""

    def __init__(self, start: int = 2):
        from pyro_autospec.oracles.markov import MarkovChainOracle

        self.inner = MarkovChainOracle([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], 40)
        self.num_coords, self.num_values = 40, 2
        self.calls, self.start = 0, start

    def log_marginals(self, values, mask):
        return self.inner.log_marginals(values, mask)

    def log_marginals_chain(self, values, mask, chain):
        return self.inner.log_marginals_chain(values, mask, chain)

    def log_marginals_chain_then(self, values, mask, chain, then):
        out, after = self.inner.log_marginals_chain_then(values, mask, chain, then)
        self.calls += 1
        if self.calls >= self.start:
            after = torch.full_like(after, float("nan"))
        return out, after


@pytest.mark.parametrize("method", ["autospec", "speculative"])
def test_bad_prefetched_row_is_named(method):
    """A NaN in the draft row prefetched with a verification (asked with its chain in one
    call) is an error that says which row it was, on the token methods' control plane."""
    with pytest.raises(OracleError, match="prefetched row for coordinate .* contains NaN"):
        sample_any_order(BadAfterChain(), 4, seed=0, method=method)


def test_host_rows_are_checked_like_tensor_rows():
    """The host control plane's check (:func:`normalise_rows`) flags what the tensor path
    flags: a NaN, a ``+inf``, a row without mass, a row that does not sum to one; padding is
    never flagged; good rows are renormalised in float64."""
    import numpy as np

    from pyro_autospec.engine.rows import _checked, normalise_rows

    good = np.log(np.array([0.25, 0.75]))
    rows = np.array(
        [
            [good, [np.nan, 0.0], [np.inf, 0.0]],
            [[-np.inf, -np.inf], np.log([0.5, 0.7]), [-np.inf, -np.inf]],
        ]
    )
    valid = np.array([[True, True, True], [True, True, False]])
    answer = normalise_rows(rows, valid, 1e-5)
    assert answer.bad.tolist() == [[False, True, True], [True, True, False]]
    np.testing.assert_allclose(np.exp(answer.log_probs[0, 0]), [0.25, 0.75], rtol=1e-15)
    tensor = _checked(torch.from_numpy(rows), torch.from_numpy(valid))
    assert np.array_equal(tensor.bad.numpy(), answer.bad)
    assert np.array_equal(tensor.log_probs.numpy()[0, 0], answer.log_probs[0, 0])
    float32 = normalise_rows(rows.astype(np.float32), valid, 1e-5)
    assert np.array_equal(float32.bad, answer.bad)


def test_rows_with_nothing_to_flag_are_normalised_as_any_others():
    """:func:`normalise_rows` skips its guards when every row has a finite top entry; each row
    is still normalised and checked bit for bit as in a batch that takes the guarded path
    (a NaN row added)."""
    import numpy as np

    from pyro_autospec.engine.rows import normalise_rows

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(50, 3, 4)) * 3
    rows[rng.random(rows.shape) < 0.2] = -np.inf
    rows[:, :, 0] = np.maximum(rows[:, :, 0], -1.0)  # every row keeps some mass
    rows[:5] -= np.log(np.exp(rows[:5]).sum(-1, keepdims=True))  # some rows sum to one
    valid = rng.random(rows.shape[:2]) < 0.8
    fast = normalise_rows(rows, valid, 1e-5)
    guarded = normalise_rows(
        np.concatenate([rows, np.full((1, 3, 4), np.nan)]),
        np.concatenate([valid, np.ones((1, 3), dtype=bool)]),
        1e-5,
    )
    assert guarded.bad[-1].all() and fast.bad[:5].sum() == 0 and fast.bad[5:].any()
    for field in ("log_probs", "bad", "log_mass"):
        assert np.array_equal(getattr(fast, field), getattr(guarded, field)[:-1])


def test_width_groups_on_the_host_and_on_tensors_agree():
    """One grouping of requests by width: the host function and its tensor wrapper."""
    import numpy as np

    from pyro_autospec.engine.rows import host_width_groups, width_groups

    width = np.array([1, 1, 2, 64, 3, 64, 1, 200, 5] * 40)
    host = host_width_groups(width)
    tensors = width_groups(torch.from_numpy(width))
    assert [g.tolist() for g in host] == [t.tolist() for t in tensors]
    assert sorted(np.concatenate(host).tolist()) == list(range(width.size))
    assert len(host) > 1  # wide and narrow requests are asked apart


class NetworkOracle(torch.nn.Module):
    """A small any-order network as a user writes one: an ``nn.Module`` whose rows come from
    ``net``; ``layer`` is placed after its hidden layer."""

    num_values = 2

    def __init__(self, layer: torch.nn.Module, n: int = 6):
        super().__init__()
        self.num_coords = n
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2 * n, 16), layer, torch.nn.Tanh(), torch.nn.Linear(16, 2 * n)
        )

    def log_marginals(self, values, mask):
        features = torch.cat([(values * mask).double(), mask.double()], 1).float()
        out = self.net(features).view(-1, self.num_coords, 2).double()
        return torch.log_softmax(out, -1)


@pytest.mark.parametrize(
    "layer, name",
    [(torch.nn.Dropout(0.2), "Dropout"), (torch.nn.BatchNorm1d(16), "BatchNorm1d")],
)
def test_a_network_in_training_mode_is_refused_until_eval(layer, name):
    """Dropout answers at random and batch norm from the batch: the same row asked twice (draft
    and verification) differs, so no sampler is exact for such an oracle. Refused with the
    fix named; after ``eval()`` it samples, and deterministically."""
    oracle = NetworkOracle(layer)
    with pytest.raises(OracleError, match=rf"oracle\.net\[1\] \({name}\).*training mode.*eval\(\)"):
        sample_any_order(oracle, 4, seed=0)
    oracle.eval()
    first = sample_any_order(oracle, 4, seed=0)
    assert torch.equal(first.samples, sample_any_order(oracle, 4, seed=0).samples)


def test_harmless_training_mode_and_zero_dropout_are_accepted():
    """Training mode changes nothing without a random or batch-dependent layer."""
    sample_any_order(NetworkOracle(torch.nn.Identity()), 2, seed=0)
    sample_any_order(NetworkOracle(torch.nn.Dropout(0.0)), 2, seed=0)


def test_a_drift_calling_a_network_in_training_mode_is_refused():
    """Found through a closure, a bound method, an attribute and a functools.partial."""
    times = torch.linspace(0.0, 1.0, 9)
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))

    def run(network, t, x):
        return network(x.float()).to(x.dtype)

    class Drift:
        dim = 2

        def __init__(self):
            self.network = net

        def __call__(self, t, x):
            return self.network(x.float()).to(x.dtype)

    for drift, name in [
        (lambda t, x: net(x.float()).to(x.dtype), "net"),
        (net.forward, "oracle.__self__"),
        (Drift(), "oracle.network"),
        (functools.partial(run, net), r"oracle\.args\[0\]"),
    ]:
        with pytest.raises(OracleError, match=rf"^{name}\[1\] \(Dropout\)"):
            sample_sde(drift, times, torch.zeros(2), 3, seed=0)
    net.eval()
    sample_sde(lambda t, x: net(x.float()).to(x.dtype), times, torch.zeros(2), 3, seed=0)


def test_the_training_mode_check_accepts_an_oracle_with_slots():
    """An oracle with ``__slots__`` (no ``__dict__`` to look for networks in) samples as
    before."""

    class Slotted:
        __slots__ = ("inner", "num_coords", "num_values")

        def __init__(self):
            self.inner = TabularOracle(logits=good_table())
            self.num_coords, self.num_values = 2, 2

        def log_marginals(self, values, mask):
            return self.inner.log_marginals(values, mask)

    assert sample_any_order(Slotted(), 3, seed=0).samples.shape == (3, 2)


def test_networks_in_containers_and_nested_attributes_are_found():
    """A network in a list or dict attribute, or two attributes down, is found and named as
    the user wrote it; after ``eval()`` the oracle samples."""

    class Holder:
        def __init__(self, net):
            self.net = net

    class Oracle:
        num_coords, num_values = 6, 2

        def __init__(self, where):
            self.net = NetworkOracle(torch.nn.Dropout(0.3))
            if where == "list":
                self.nets = [self.net]
            elif where == "dict":
                self.parts = {"net": self.net}
            else:
                self.model = Holder(self.net)
            del self.net

        def _network(self):
            return next(iter(m for m in _all(self) if isinstance(m, NetworkOracle)))

        def log_marginals(self, values, mask):
            return self._network().log_marginals(values, mask)

    def _all(oracle):
        return [*getattr(oracle, "nets", []), *getattr(oracle, "parts", {}).values()] + [
            getattr(getattr(oracle, "model", None), "net", None)
        ]

    for where, name in [
        ("list", r"oracle\.nets\[0\]"),
        ("dict", r"oracle\.parts\['net'\]"),
        ("nested", r"oracle\.model\.net"),
    ]:
        oracle = Oracle(where)
        with pytest.raises(OracleError, match=rf"^{name}\.net\[1\] \(Dropout\).*{name}\.eval"):
            sample_any_order(oracle, 2, seed=0)
        oracle._network().eval()
        assert sample_any_order(oracle, 2, seed=0).samples.shape == (2, 6)


class NaNAfterTwoPinned:
    """Rows conditioned on two coordinates or more are NaN: the first bad row of a chain is
    its second, not its first."""

    num_coords, num_values = 4, 2

    def log_marginals(self, values, mask):
        out = torch.full((values.shape[0], 4, 2), -torch.log(torch.tensor(2.0)).item())
        out = out.double()
        out[mask.sum(1) >= 2] = float("nan")
        return out


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_a_bad_verification_row_is_described_by_its_own_mass(engine):
    """Both engines say what is wrong with the row that is bad (here: NaN), not with another
    row of its chain."""
    with pytest.raises(OracleError, match="contains NaN"):
        sample_any_order(
            NaNAfterTwoPinned(), 4, seed=0, engine=engine, schedule=Schedule(max_block=4)
        )


def test_the_fast_engine_names_the_draw_and_prefix_of_a_bad_verification_row():
    with pytest.raises(
        OracleError,
        match=r"verification row for coordinate \d of draw \d+ conditioned on its first 2 "
        r"coordinates",
    ):
        sample_any_order(NaNAfterTwoPinned(), 4, seed=0, schedule=Schedule(max_block=4))


class NaNAtThree:
    """NaN in coordinate 3's row, whatever is pinned."""

    num_coords, num_values = 6, 3

    def log_marginals(self, values, mask):
        out = torch.full((values.shape[0], 6, 3), -torch.log(torch.tensor(3.0)).item())
        out = out.double()
        out[:, 3, 1] = float("nan")
        return out


@pytest.mark.parametrize("order", ["random", [0, 1, 2, 3, 4, 5]])
@pytest.mark.parametrize("method", ["sequential", "autospec", "speculative", "agr24"])
def test_a_bad_row_is_named_by_its_coordinate_and_draw(method, order):
    """Not by its place in the oracle call, which a user would take for a coordinate."""
    with pytest.raises(OracleError, match=r"row for coordinate 3 of draw \d+, conditioned on"):
        sample_any_order(NaNAtThree(), 4, seed=0, method=method, order=order)


class ShortChain:
    """Answers one step fewer than the chain asks for."""

    num_coords, num_values = 4, 2

    def log_marginals(self, values, mask):
        return torch.full((values.shape[0], 4, 2), 0.5).log().double()

    def log_marginals_chain(self, values, mask, chain):
        return torch.full((values.shape[0], chain.shape[1] - 1, 2), 0.5).log().double()


def test_a_chain_of_the_wrong_length_points_at_the_chain_not_at_num_coords():
    with pytest.raises(OracleError, match=r"chain length.*chain\.shape\[1\] steps") as info:
        sample_any_order(ShortChain(), 4, seed=0, schedule=Schedule(max_block=4))
    assert "num_coords" not in str(info.value)


class WritesIntoValues:
    """A plain oracle (not inference-safe) that zeroes the unpinned values in place."""

    num_coords, num_values = 2, 2

    def log_marginals(self, values, mask):
        values[~mask] = 0
        return TabularOracle(logits=good_table()).log_marginals(values, mask)


@pytest.mark.parametrize("method", ["autospec", "agr24", "sequential"])
def test_an_oracle_writing_into_its_inputs_is_told_to_copy_them(method):
    """Under no_grad the inputs are the engine's inference tensors; with grad enabled they are
    copies made for the oracle (autograd may save them), where a write is harmless."""
    with torch.no_grad(), pytest.raises(OracleError, match=r"wrote in place.*values\.clone\(\)"):
        sample_any_order(WritesIntoValues(), 3, seed=0, method=method)
    written = sample_any_order(WritesIntoValues(), 3, seed=0, method=method)
    plain = sample_any_order(TabularOracle(logits=good_table()), 3, seed=0, method=method)
    assert torch.equal(written.samples, plain.samples)


def test_the_network_search_skips_what_it_cannot_read_and_trusts_declared_oracles():
    """An attribute whose ``__dict__`` raises (a proxy) is not searched, not a crash; an oracle
    that declares ``consistent_queries`` is searched one step deep only, so a network it
    holds further away and never calls (a model's guide, compiled away) is not refused."""

    class Proxy:
        @property
        def __dict__(self):
            raise RuntimeError("no context")

    class Holder:
        def __init__(self):
            self.proxy = Proxy()
            self.model = types.SimpleNamespace(guide=torch.nn.Dropout(0.5))  # in training mode
            self.inner = TabularOracle(logits=good_table())
            self.num_coords, self.num_values = 2, 2

        def log_marginals(self, values, mask):
            return self.inner.log_marginals(values, mask)

    oracle = Holder()
    with pytest.raises(OracleError, match=r"oracle\.model\.guide \(Dropout\)"):
        sample_any_order(oracle, 2, seed=0)
    oracle.consistent_queries = True
    assert sample_any_order(oracle, 2, seed=0).samples.shape == (2, 2)


def test_networks_on_the_class_in_slots_and_read_by_methods_are_found():
    """A network kept on the oracle's class, in its ``__slots__``, read by a method as a global
    or behind a property is within its reach too, with ``consistent_queries`` or without."""
    global _GLOBAL_NET
    _GLOBAL_NET = torch.nn.Dropout(0.3)

    class Plain:
        num_coords, num_values = 2, 2

        def log_marginals(self, values, mask):
            return TabularOracle(logits=good_table()).log_marginals(values, mask)

    class OnTheClass(Plain):
        net = torch.nn.Dropout(0.3)

    class InSlots(Plain):
        __slots__ = ("held",)

        def __init__(self):
            self.held = torch.nn.Dropout(0.3)

    class ReadsAGlobal(Plain):
        def log_marginals(self, values, mask):
            _GLOBAL_NET(torch.zeros(1))
            return super().log_marginals(values, mask)

    class BehindAProperty(Plain):
        @property
        def network(self):
            return _GLOBAL_NET

    for oracle, name in [
        (OnTheClass(), r"oracle\.net"),
        (InSlots(), r"oracle\.held"),
        (ReadsAGlobal(), r"_GLOBAL_NET"),
        (BehindAProperty(), r"_GLOBAL_NET"),
    ]:
        with pytest.raises(OracleError, match=rf"^{name} \(Dropout\) is in training mode"):
            sample_any_order(oracle, 2, seed=0)
    OnTheClass.net.eval()
    _GLOBAL_NET.eval()
    slotted = InSlots()
    slotted.held.eval()
    for oracle in (OnTheClass(), slotted, ReadsAGlobal(), BehindAProperty()):
        assert sample_any_order(oracle, 2, seed=0).samples.shape == (2, 2)


def test_a_network_a_drift_objects_call_reads_as_a_global_is_found():
    """A drift written as a class whose ``__call__`` reads a module-level network in training
    mode was not named (found outside the project): the search skipped dunder methods."""
    global _GLOBAL_DRIFT_NET
    _GLOBAL_DRIFT_NET = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Dropout(0.5))

    class GlobalNet:
        dim = 1

        def __call__(self, t, x):
            return _GLOBAL_DRIFT_NET(x)[..., :1]

    with pytest.raises(OracleError, match=r"^_GLOBAL_DRIFT_NET\[1\] \(Dropout\) is in training"):
        check_eval_mode(GlobalNet())
    _GLOBAL_DRIFT_NET.eval()
    check_eval_mode(GlobalNet())


def test_a_random_oracle_is_told_about_eval_mode():
    """An oracle whose answers are random (a network in training mode the search cannot see)
    is refused by the consistency check, whose message names ``.eval()``."""

    class Noisy:
        num_coords, num_values = 4, 2

        def log_marginals(self, values, mask):
            logits = torch.randn(values.shape[0], 4, 2, dtype=torch.float64)
            return torch.log_softmax(logits, -1)

    with pytest.raises(OracleError, match=r"same answer each time.*\.eval\(\)"):
        sample_any_order(Noisy(), 2, seed=0)


class Memoised:
    """Keeps its last inputs and answer, and answers again when asked the same: X0 ~ Bern(1/2)
    and X1 = X0. Right only if the inputs it keeps are never written again."""

    num_coords, num_values = 2, 2

    def __init__(self):
        self.last = None

    def log_marginals(self, values, mask):
        if self.last is not None:
            kept_values, kept_mask, out = self.last
            if torch.equal(kept_values, values) and torch.equal(kept_mask, mask):
                return out
        out = torch.full((values.shape[0], 2, 2), 0.5, dtype=torch.float64).log()
        for i, j in ((0, 1), (1, 0)):
            pinned = mask[:, j]
            copy = torch.nn.functional.one_hot(values[:, j], 2).double().log()
            out[pinned, i] = copy[pinned]
        self.last = (values, mask, out)
        return out


@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_an_oracle_may_keep_its_inputs(engine, method):
    """Every call gets fresh inputs: a cache keyed on the last inputs stays right."""
    result = sample_any_order(Memoised(), 200, seed=0, method=method, engine=engine)
    assert torch.equal(result.samples[:, 0], result.samples[:, 1])


class KeepsViews:
    """A ``log_marginals_at``-only Markov chain that keeps a view of every call's inputs and
    checks, at each call, that none of them was written since."""

    def __init__(self, n: int):
        self.chain = MarkovChainOracle(
            torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.3, 0.7]]), n
        )
        self.num_coords, self.num_values = n, 2
        self.kept: list = []

    def log_marginals(self, values, mask):
        return self.chain.log_marginals(values, mask)

    def log_marginals_at(self, values, mask, targets):
        for view, copy in self.kept:
            assert torch.equal(view, copy), "an input the oracle kept was written again"
        if len(self.kept) < 40:
            half = values[:, : values.shape[1] // 2]  # a view, not the tensor handed over
            self.kept.append((half, half.clone()))
        return self.chain.log_marginals_at(values, mask, targets)


def test_inputs_an_oracle_keeps_views_of_are_never_written_again():
    oracle = KeepsViews(64)
    plain = sample_any_order(oracle.chain, 32, seed=3)
    kept = sample_any_order(oracle, 32, seed=3, schedule=plain.schedule)
    assert len(oracle.kept) > 10 and torch.equal(kept.samples, plain.samples)


class ThenForgetsAfter:
    """``log_marginals_chain_then`` returns the chain's rows alone, not ``(out, after)``."""

    num_coords, num_values = 16, 2

    def log_marginals(self, values, mask):
        return torch.full((values.shape[0], 16, 2), 0.5, dtype=torch.float64).log()

    def log_marginals_chain(self, values, mask, chain):
        return torch.full((chain.shape[0], chain.shape[1], 2), 0.5, dtype=torch.float64).log()

    def log_marginals_chain_then(self, values, mask, chain, then):
        return self.log_marginals_chain(values, mask, chain)


@pytest.mark.parametrize("draws", [1, 2, 5])
@pytest.mark.parametrize("trusted", [False, True])
def test_chain_then_must_return_a_pair(draws, trusted):
    oracle = ThenForgetsAfter()
    oracle.consistent_queries = trusted  # with and without the check before sampling
    with pytest.raises(OracleError, match=r"must return a pair \(out, after\).*got Tensor"):
        sample_any_order(oracle, draws, seed=0)


def test_a_sparse_output_is_refused():
    class Sparse:
        num_coords, num_values = 2, 2

        def log_marginals(self, values, mask):
            return TabularOracle(logits=good_table()).log_marginals(values, mask).to_sparse()

    for trusted in (False, True):
        oracle = Sparse()
        oracle.consistent_queries = trusted
        with pytest.raises(OracleError, match=r"layout torch\.sparse_coo.*to_dense"):
            sample_any_order(oracle, 2, seed=0)


def test_a_row_off_by_rounding_of_a_narrower_dtype_is_explained():
    with pytest.raises(OracleError, match=r"lower precision than the dtype returned"):
        sample_any_order(Wrapped(lambda out: out + 1e-3), 3, seed=0, method="sequential")


class Probabilities:
    """A user slip: the marginals themselves, not their logarithms, on targeted rows."""

    num_coords, num_values = 2, 2

    def __init__(self):
        self.inner = TabularOracle(logits=good_table())

    def log_marginals_at(self, values, mask, targets):
        return self.inner.log_marginals_at(values, mask, targets).exp()


@pytest.mark.parametrize("oracle", [Wrapped(torch.exp), Probabilities()])
@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_probabilities_returned_as_log_probabilities_are_named(oracle, engine, method):
    """Rows of probabilities are told to take their log, and warned off log_softmax, which
    would normalise them into another law without an error."""
    message = r"holds probabilities, not their logarithms\. Return probs\.log\(\), not log_softmax"
    with pytest.raises(OracleError, match=message):
        sample_any_order(oracle, 3, seed=0, method=method, engine=engine)


@pytest.mark.parametrize("shift", [1.0, -0.5])
def test_logits_and_weights_are_not_taken_for_probabilities(shift):
    """Shifted log probabilities (all >= 0 on a fair coin at shift 1) and weights are not
    probabilities: the message keeps to the log_softmax advice."""
    for corrupt in (lambda out: out + shift, lambda out: (out + shift).exp()):
        with pytest.raises(OracleError, match="sums to") as error:
            sample_any_order(Wrapped(corrupt), 3, seed=0)
        assert "holds probabilities" not in str(error.value)


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"method": "agr24", "window_scale": float("inf")}, "window_scale must be a finite"),
        ({"method": "agr24", "window_scale": True}, "window_scale must be a finite"),
        ({"method": "speculative", "window": None}, "window must be a positive int"),
        ({"method": "speculative", "window": 2.5}, "window must be a positive int"),
        ({"method": "speculative", "window": "8"}, "window must be a positive int"),
        ({"min_block": 2.5}, "min_block must be a positive int"),
        ({"first_block": 0}, "first_block must be a positive int or None"),
        ({"min_block": 4, "max_block": 2}, r"min_block=4 is larger than max_block=2; pass"),
        ({"min_block": 100}, r"larger than max_block=8 \(this run's default\)"),
        ({"token_below": True}, r"token_below must be an int >= 0 or None; got True"),
        ({"token_below": 2.5}, r"token_below must be an int >= 0 or None"),
        ({"race_depth": 1.5}, r"race_depth must be an int >= 0 or None"),
        ({"first_block": 10**6}, r"first_block=1000000 is larger than max_block=8"),
        ({"device": "meta"}, "meta tensors hold no numbers"),
        ({"device": "nonsense"}, "is not a torch device"),
    ],
)
def test_bad_knobs_and_devices_are_refused_before_sampling(knobs, message):
    options = {k: v for k, v in knobs.items() if k in ("method", "device")}
    schedule = {k: v for k, v in knobs.items() if k not in options}
    with pytest.raises(ValueError, match=message):
        sample_any_order(Wrapped(lambda out: out), 2, seed=0, schedule=schedule, **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine has the device")
def test_a_cuda_device_without_cuda_is_refused_clearly():
    with pytest.raises(ValueError, match=r"sees no CUDA GPU.*device='cpu'"):
        sample_any_order(Wrapped(lambda out: out), 2, seed=0, device="cuda")
    with pytest.raises(ValueError, match=r"sees no CUDA GPU"):
        sample_sde(lambda t, x: -x, torch.linspace(0, 1, 5), torch.zeros(1), 2, device="cuda")


def test_a_huge_agr24_window_scale_samples():
    result = sample_any_order(
        Wrapped(lambda out: out), 3, seed=0, method="agr24", schedule=Schedule(window_scale=1e30)
    )
    assert result.samples.shape == (3, 2)


class FamilyWithoutDraws:
    """``num_draws`` (a family of targets) but no ``draws`` keyword."""

    num_coords, num_values, num_draws = 4, 2, 8

    def log_marginals(self, values, mask):
        return torch.full((values.shape[0], 4, 2), 0.5).log().double()


def test_a_family_whose_queries_take_no_draws_keyword_is_told_why_it_is_passed():
    with pytest.raises(TypeError, match=r"log_marginals takes no keyword draws.*num_draws = 8"):
        sample_any_order(FamilyWithoutDraws(), 8, seed=0)


@pytest.mark.parametrize("value", [5.5, "5", True, 0, torch.tensor(5)])
def test_num_draws_must_be_an_int_and_is_never_truncated(value):
    """``num_draws = 5.5`` was a family of 5 targets, and ``"5"`` or ``True`` were accepted
    (found outside the project)."""

    class Family(FamilyWithoutDraws):
        num_draws = value

    with pytest.raises(TypeError, match=r"oracle\.num_draws must be None or an int >= 1"):
        sample_any_order(Family(), 5, seed=0)


_held = torch.nn.Dropout(0.5)  # a module-level network in training mode, named like an attribute


def test_an_attribute_named_like_a_global_network_is_no_read_of_that_global():
    """An oracle reading ``self._held`` (in eval mode) was refused because a module-level
    ``_held`` in training mode existed: the search read every name of the function's code,
    attribute names included, as globals (found outside the project)."""

    class ReadsItsAttribute:
        num_coords, num_values = 2, 2

        def __init__(self):
            self._held = torch.nn.Dropout(0.5).eval()

        def log_marginals(self, values, mask):
            logits = self._held(torch.zeros(values.shape[0], 2, 2, dtype=torch.float64))
            return torch.log_softmax(logits, dim=-1)

    assert _held.training
    assert sample_any_order(ReadsItsAttribute(), 2, seed=0).samples.shape == (2, 2)

    class ReadsTheGlobalInAComprehension(ReadsItsAttribute):
        def log_marginals(self, values, mask):
            rows = [_held(torch.zeros(2, 2, dtype=torch.float64)) for _ in range(values.shape[0])]
            return torch.log_softmax(torch.stack(rows), dim=-1)

    with pytest.raises(OracleError, match=r"^_held \(Dropout\) is in training"):
        check_eval_mode(ReadsTheGlobalInAComprehension())
