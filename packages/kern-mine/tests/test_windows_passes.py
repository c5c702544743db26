import numpy as np
from synth import Spec, write_capture

from kern_mine.capture import load_capture
from kern_mine.mine import MineOptions, mine
from kern_mine.report import render_text
from kern_mine.windows import AUTO_FLOOR_NS, split_windows


def test_auto_threshold_is_far_above_the_median_gap():
    t = np.cumsum([0] + [5_000] * 9 + [3_000_000] + [5_000] * 9 + [60_000_000] + [5_000] * 4)
    ws = split_windows(t)
    assert ws.rule == "auto" and ws.gap_ns == AUTO_FLOOR_NS  # 1000 × 5 µs = 5 ms
    assert ws.ranges == [(0, 20), (20, 25)]
    slow = split_windows(t * 10)  # a 10× slower host: the threshold scales with it
    assert slow.gap_ns == 50_000_000 and slow.ranges == [(0, 20), (20, 25)]
    fixed = split_windows(t, gap_ms=1.0)
    assert fixed.rule == "fixed" and fixed.ranges == [(0, 10), (10, 20), (20, 25)]


def test_windows_and_passes(standard):
    _, truth, r = standard
    assert r.summary.windows == 5 and r.summary.requests == 4
    # every pass starts with embed after the host's pause: the one start kernel, no anchor needed
    assert [(k.symbol, k.windows, k.passes) for k in r.pass_split.start_kernels] == [("embed", 5, 19)]
    tokens = [[p.tokens for p in w.passes] for w in r.other_windows + r.requests]
    assert tokens == truth.windows == [[64, 17, 3], [1, 1, 1, 1], [5, 1, 1, 1], [16, 1, 1, 1], [30, 1, 1, 1]]
    kinds = [[p.kind for p in w.passes] for w in r.requests]
    assert kinds == [["prefill", "decode", "decode", "decode"]] * 4
    assert [p.kind for p in r.other_windows[0].passes] == ["other"] * 3
    # every pass is exactly one forward: 6 + 8 per layer × 3 launches
    for w in r.requests + r.other_windows:
        for p in w.passes:
            assert p.launches[1] - p.launches[0] == 30 and p.regular


def test_jittered_boundaries_are_repaired(standard):
    _, _, r = standard
    moved = {p.index: p.start_moved for w in r.requests for p in w.passes if p.start_moved}
    # pass 5's argmax came after the pause: pass 6 starts one launch later;
    # pass 9's embed came before the pause: pass 9 starts one launch earlier.
    assert moved == {6: 1, 9: -1}
    p6 = next(p for w in r.requests for p in w.passes if p.index == 6)
    assert p6.launches == (180, 210)


def test_back_to_back_passes_are_irregular(tmp_path):
    # pass 1 and 2 of the warm-up with no pause between them: one pass of two forwards
    spec = Spec(prompts=[4, 8], warmup=[32, 9, 2], early_head=set())
    write_capture(tmp_path, spec)
    cap = load_capture(tmp_path)
    lines = (tmp_path / "launches.jsonl").read_text().splitlines()
    # close the pause between warm-up passes 1 and 2 by shifting pass 2 back in time
    import json
    recs = [json.loads(x) for x in lines]
    shift = recs[60]["t_ns"] - recs[59]["t_ns"] - 5_000
    for x in recs[60:90]:
        x["t_ns"] -= shift
    (tmp_path / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    assert len(cap.launches) == len(recs)
    r = mine(tmp_path)
    w = r.other_windows[0]
    # every flat kernel of the merged pass is launched twice its modal count (gemms are not counted)
    assert [(p.regular, p.launches, p.mismatch) for p in w.passes] == [(True, (0, 30), 0), (False, (30, 90), 40)]
    assert w.passes[1].note == "40 of 40 counted launches are of kernels launched a non-modal number of times"
    assert [p.tokens for p in w.passes] == [32, None]
    assert [[p.tokens for p in w.passes] for w in r.requests] == [[4, 1, 1, 1], [8, 1, 1, 1]]


def test_fixed_gap_option(standard):
    d, _, _ = standard
    r = mine(d, MineOptions(gap_ms=0.5))  # below the pause between passes: one window per pass
    assert r.summary.windows == 19 and r.summary.requests == 0 and r.options.gap_rule == "fixed"
    # no request, no forward program to count over (the share over all multi-count shapes remains)
    assert r.summary.request_shapes == [] and r.summary.flat_sites_request_shapes == 0
    assert "requests' pass shapes" not in render_text(r)


def test_autotuning_noise_does_not_disturb_passes(tmp_path, standard):
    # A compile window where `act` is benchmarked in 8 bursts of 25 (with L2 flushes
    # between, a host sync after each burst): no pass-start kernel is launched there
    # (l2_flush starts every burst, but cutting there explains nothing: `act` is launched
    # 25 times per burst, not its modal 3), so it stays one irregular pass and the model's
    # passes are exactly those of the capture without it.
    spec = Spec(prompts=[1, 5, 16, 30], warmup=[64, 17, 3], late_tail={5}, early_head={9}, autotune=8)
    write_capture(tmp_path, spec)
    r = mine(tmp_path)
    assert [k.symbol for k in r.pass_split.start_kernels] == ["embed"]
    noise = r.other_windows[0]
    assert noise.launches == (0, 400) and [p.regular for p in noise.passes] == [False]
    assert noise.passes[0].note == "400 of 400 counted launches are of kernels launched a non-modal number of times"
    assert [[p.tokens for p in w.passes] for w in r.requests] == [[1, 1, 1, 1], [5, 1, 1, 1], [16, 1, 1, 1], [30, 1, 1, 1]]
    _, _, ref = standard
    assert r.summary.fields == ref.summary.fields and r.summary.pointers == ref.summary.pointers


def test_many_autotune_fragments_do_not_outvote_the_passes(tmp_path):
    # 30 autotune bursts launch `act` 25 times each, against 19 forward passes launching it 3
    # times: counted per fragment, 25 would be `act`'s modal count and every forward pass would be
    # irregular; each window votes once, so the modal count is 3.
    spec = Spec(prompts=[1, 5, 16, 30], warmup=[64, 17, 3], late_tail={5}, early_head={9}, autotune=30)
    write_capture(tmp_path, spec)
    r = mine(tmp_path)
    assert [[p.tokens for p in w.passes] for w in r.requests] == [[1, 1, 1, 1], [5, 1, 1, 1], [16, 1, 1, 1], [30, 1, 1, 1]]
    assert r.summary.regular_passes == 19 and r.other_windows[0].passes[0].regular is False
