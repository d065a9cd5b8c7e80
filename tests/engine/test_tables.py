"""The flat (ragged) layout helpers of the engine's tables."""

import pytest
import torch

from pyro_autospec.engine.tables import _segment_sum_by_scan, ragged, segment_cumsum, segment_sum


def _sizes(seed: int, count: int, longest: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    size = torch.randint(0, longest + 1, (count,), generator=g)
    size[0] = longest  # the longest segment is always there
    return size


def test_ragged_layout():
    segment, position, start = ragged(torch.tensor([3, 0, 1, 2]))
    assert segment.tolist() == [0, 0, 0, 2, 3, 3]
    assert position.tolist() == [0, 1, 2, 0, 0, 1]
    assert start.tolist() == [0, 3, 3, 4]
    segment, position, start = ragged(torch.zeros(0, dtype=torch.long))
    assert segment.numel() == position.numel() == start.numel() == 0


@pytest.mark.parametrize("longest", [1, 2, 3, 7, 64, 200])
@pytest.mark.parametrize("shape", [(), (3,)])
def test_segment_cumsum_and_sum_match_each_segment_alone(longest, shape):
    size = _sizes(longest, 23, longest)
    segment, position, start = ragged(size)
    g = torch.Generator().manual_seed(1)
    values = torch.randn(segment.numel(), *shape, generator=g, dtype=torch.float64)
    scanned = segment_cumsum(values, position, longest)
    total = segment_sum(values, size, position)
    by_scan = _segment_sum_by_scan(values, size, position)
    assert total.shape == by_scan.shape == (size.numel(), *shape)
    for k, (s, n) in enumerate(zip(start.tolist(), size.tolist())):
        own = values[s : s + n]
        torch.testing.assert_close(scanned[s : s + n], own.cumsum(0), rtol=1e-12, atol=1e-12)
        expected = own.sum(0) if n else torch.zeros(shape, dtype=torch.float64)
        torch.testing.assert_close(total[k], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(by_scan[k], expected, rtol=1e-12, atol=1e-12)
        # a segment's sums are its own: the same bits whatever else shares the call
        alone = segment_cumsum(own, torch.arange(n), n)
        assert torch.equal(scanned[s : s + n], alone)
        if n:
            assert torch.equal(total[k], segment_sum(own, torch.tensor([n]), torch.arange(n))[0])


def test_segment_cumsum_leaves_its_input_alone():
    values = torch.ones(5, dtype=torch.float64)
    out = segment_cumsum(values, torch.tensor([0, 1, 2, 0, 1]), 3)
    assert out.tolist() == [1.0, 2.0, 3.0, 1.0, 2.0]
    assert values.tolist() == [1.0] * 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_segment_sum_on_cuda_is_each_segments_own():
    # torch.segment_reduce on CUDA: close to the CPU's sums, and a segment's sum does not
    # depend on the other segments of the call (what keeps diffusion draws independent of
    # the batch on a GPU).
    size = _sizes(5, 40, 50)
    segment, position, start = ragged(size)
    values = torch.randn(segment.numel(), 3, dtype=torch.float64)
    cpu = segment_sum(values, size, position)
    gpu = segment_sum(values.cuda(), size.cuda(), position.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-12, atol=1e-12)
    for k, (s, n) in enumerate(zip(start.tolist(), size.tolist())):
        if n:
            own = values[s : s + n].cuda()
            alone = segment_sum(
                own, torch.tensor([n], device="cuda"), torch.arange(n, device="cuda")
            )
            assert torch.equal(gpu[k], alone[0])
