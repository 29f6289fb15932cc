"""Judge evaluation: the maths on hand-made labels, and scripted judges over real HTTP whose accuracy,
position bias and invalid answers are known, recovered by `evaluate_judges`; selection keeps the
better judge and refuses two bad ones."""

from __future__ import annotations

import json
import math
import random

import pytest
from judge_helpers import Reply, answer, shown_trajectories

import groupwise as gw
from groupwise.errors import InvalidDataError
from groupwise.judge import (
    JudgeSpec,
    LabelledGroup,
    evaluate_judges,
    format_table,
    load_labelled,
    save_labelled,
    select_judge,
)
from groupwise.judge.evaluate import bootstrap_ratio, flips, kendall_tau_b, pairwise_agreement

# ----------------------------------------------------------------------------- maths


def test_pairwise_agreement_counts_label_pairs_and_half_ties():
    labels = [1.0, 0.5, 0.5, 0.0]  # 5 pairs differ (the two 0.5s tie and are skipped)
    assert pairwise_agreement(labels, [0.9, 0.6, 0.4, 0.1]) == (5.0, 5)
    # reversed judge: 0 of 5
    assert pairwise_agreement(labels, [0.1, 0.4, 0.6, 0.9]) == (0.0, 5)
    # the judge ties 0 and 1: (0,1) counts 0.5; (0,2), (0,3), (1,3), (2,3) agree -> 4.5
    assert pairwise_agreement(labels, [0.8, 0.8, 0.4, 0.1]) == (4.5, 5)


def test_kendall_tau_b_with_ties_matches_the_formula():
    # x has one tied pair, y none: n0=6, C=5 concordant, D=0, ties_x=1 -> 5 / sqrt(5 * 6)
    assert kendall_tau_b([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))
    # scipy's value for this case is 0.9128709291752769 (= 5/sqrt(30))
    assert kendall_tau_b([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9128709291752769)
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    # both sides tied in pair (0,1); x=[1,1,2], y=[5,5,1]: C=0, D=2, ties 1 each -> -2 / sqrt(2*2)
    assert kendall_tau_b([1, 1, 2], [5, 5, 1]) == -1.0
    assert kendall_tau_b([1, 1], [0, 1]) is None  # no order in x


def test_flips_between_two_scorings():
    # (0,1) and (0,2) reverse; (1,2) keeps its order (0.1 < 0.5, 0.9 < 0.95)
    assert flips([0.9, 0.1, 0.5], [0.1, 0.9, 0.95]) == (2.0, 3)
    assert flips([0.9, 0.1], [0.5, 0.5]) == (0.5, 1)
    assert flips([0.3, 0.3], [0.5, 0.5]) == (0.0, 1)


def test_bootstrap_interval_of_a_fair_coin_on_ten_groups_is_the_binomial_quantiles():
    # 10 groups of one pair, 5 agreed: resampling groups draws Binomial(10, 0.5) / 10, whose 2.5% and
    # 97.5% quantiles are 0.2 and 0.8 (P(X <= 1) = 0.011 < 0.025 <= P(X <= 2) = 0.055, symmetric).
    cdf = [sum(math.comb(10, k) for k in range(j + 1)) / 2**10 for j in range(11)]
    lo_q = next(j for j in range(11) if cdf[j] >= 0.025) / 10
    hi_q = next(j for j in range(11) if cdf[j] >= 0.975) / 10
    assert (lo_q, hi_q) == (0.2, 0.8)
    point, lo, hi = bootstrap_ratio([1, 0] * 5, [1] * 10)
    assert (point, lo, hi) == (0.5, lo_q, hi_q)
    assert bootstrap_ratio([2] * 6, [2] * 6) == (1.0, 1.0, 1.0)  # always agreeing: no spread
    # pairs weigh by their count: group A 3 of 4, group B 0 of 1 -> 3/5
    assert bootstrap_ratio([3, 0], [4, 1])[0] == 0.6


def test_labelled_jsonl_scores_and_preferences(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "user", "content": "2+2?"}],
                    "trajectories": [{"answer": "4", "label": 1}, {"answer": "5", "label": 0}, {"answer": "four", "label": 0.8}]})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "title?"}], "chosen": "Good", "rejected": "BAD!!!"}) + "\n")
    a, b = load_labelled(path)
    assert a.labels == [1.0, 0.0, 0.8] and a.message_lists[2][-1] == {"role": "assistant", "content": "four"}
    assert b.labels == [1.0, 0.0] and b.message_lists[1] == [{"role": "user", "content": "title?"},
                                                             {"role": "assistant", "content": "BAD!!!"}]
    path.write_text('{"messages": [], "answers": []}\n')
    with pytest.raises(InvalidDataError, match="labels.jsonl:1"):
        load_labelled(path)


def test_a_label_file_holding_a_unicode_line_separator_reads_one_group_a_line(tmp_path):
    # as the SFT reader: str.splitlines broke a line at a raw U+2028 inside a string ("not JSON")
    path = tmp_path / "labels.jsonl"
    row = {"messages": [{"role": "user", "content": "a\u2028b"}], "chosen": "c\x85d", "rejected": "e"}
    path.write_bytes((json.dumps(row, ensure_ascii=False) + "\n").encode())
    [group] = load_labelled(path)
    assert group.message_lists[0] == [{"role": "user", "content": "a\u2028b"}, {"role": "assistant", "content": "c\x85d"}]
    path.write_bytes(b"\xff\n")
    with pytest.raises(InvalidDataError, match="labels.jsonl:1: not UTF-8 text"):
        load_labelled(path)


def test_saved_labelled_groups_load_back_with_their_common_prefix_written_once(tmp_path):
    system, board = {"role": "system", "content": "play"}, {"role": "user", "content": "board 1"}
    games = [[system, board, {"role": "assistant", "content": "<move>left</move>"}, {"role": "user", "content": "board 2"},
              {"role": "assistant", "content": "<move>up</move>"}],
             [system, board, {"role": "assistant", "content": "sideways"}]]
    same = [[system, board, {"role": "assistant", "content": "x"}], [system, board, {"role": "assistant", "content": "x"}]]
    groups = [LabelledGroup(games, [0.4, -1.0], "game 7"), LabelledGroup(same, [1.0, 0.0], "twins")]
    path = save_labelled(groups, tmp_path / "labels.jsonl")
    first = json.loads(path.read_text().splitlines()[0])
    assert first["messages"] == [system, board] and first["name"] == "game 7"
    assert [t["label"] for t in first["trajectories"]] == [0.4, -1.0] and len(first["trajectories"][0]["messages"]) == 3
    back = load_labelled(path)
    assert [(g.message_lists, g.labels, g.name) for g in back] == [(g.message_lists, g.labels, g.name) for g in groups]
    with pytest.raises(gw.ConfigError, match="tools"):
        save_labelled([LabelledGroup(same, [1.0, 0.0], "tooled", [[{"name": "f"}], None])], tmp_path / "t.jsonl")


# ----------------------------------------------------------------------------- scripted judges over HTTP

ITEM_RE = r"item=(\d+) quality=([0-9.]+)"
N_ITEMS = 40
P_BIASED, P_HONEST = 0.25, 0.7  # a biased item: the first shown wins; else honest w.p. 0.7, else reversed


def item_kind(k: int) -> str:
    rng = random.Random(f"item-{k}")
    biased, honest = rng.random() < P_BIASED, rng.random() < P_HONEST
    return "biased" if biased else ("honest" if honest else "reversed")


def labelled_items() -> list[LabelledGroup]:
    groups = []
    for k in range(N_ITEMS):
        good, bad = 0.6 + 0.01 * (k % 30), 0.1 + 0.01 * (k % 40)
        q = [good, bad] if k % 2 else [bad, good]  # the good one is not always first in the input
        groups.append(LabelledGroup(
            [[{"role": "user", "content": f"Task {k}: write a title."},
              {"role": "assistant", "content": f"answer {i} item={k} quality={x:.2f}"}] for i, x in enumerate(q)], q))
    return groups


def scripted(req) -> Reply:
    import re

    shown = shown_trajectories(req)
    found = [(t, *re.findall(ITEM_RE, b)[-1]) for t, b in shown]
    model = req["model"]
    if model == "coin":  # no signal: always prefers the first shown
        return Reply(answer([(t, 0.9 if i == 0 else 0.1) for i, (t, _, _) in enumerate(found)]))
    if model == "contrary":  # a judge that reads the answers and prefers the worse
        return Reply(answer([(t, 1 - float(q)) for t, _, q in found]))
    if model == "oracle":  # reads the answers, no position bias
        return Reply(answer([(t, float(q)) for t, _, q in found]))
    kind = item_kind(int(found[0][1]))
    if kind == "biased":
        return Reply(answer([(t, 0.9 if i == 0 else 0.1) for i, (t, _, _) in enumerate(found)]))
    sign = 1 if kind == "honest" else -1
    return Reply(answer([(t, 0.5 + sign * (float(q) - 0.5)) for t, _, q in found]))


def spec(server, model: str) -> JudgeSpec:
    return JudgeSpec(model, options={"base_url": server.url, "api_key": "test", "backoff_s": 0.0, "retries": 2})


async def test_known_accuracy_position_bias_and_invalid_answers_are_recovered(judge_server):
    first_seen: set[int] = set()

    def judge(req):
        import re

        k = int(re.findall(ITEM_RE, shown_trajectories(req)[0][1])[0][0])
        if k % 10 == 0 and k not in first_seen:  # the first request about items 0, 10, 20, 30: bad JSON
            first_seen.add(k)
            return Reply('{"scores": [oops')
        return scripted(req)

    judge_server.default = judge
    [report] = await evaluate_judges(labelled_items(), [spec(judge_server, "mixed")], orders=2, repeats=2)
    kinds = [item_kind(k) for k in range(N_ITEMS)]
    n_biased, n_honest = kinds.count("biased"), kinds.count("honest")
    # Realised: a biased item is right in one order and wrong in the other (0.5); honest 1; reversed 0.
    assert report.accuracy[0] == pytest.approx((n_honest + 0.5 * n_biased) / N_ITEMS)
    assert report.flip_rate[0] == pytest.approx(n_biased / N_ITEMS)
    # ... and the true rates of the process that drew the items lie inside the intervals.
    true_accuracy = P_BIASED * 0.5 + (1 - P_BIASED) * P_HONEST
    assert report.accuracy[1] <= true_accuracy <= report.accuracy[2]
    assert report.flip_rate[1] <= P_BIASED <= report.flip_rate[2]
    assert report.accuracy[2] - report.accuracy[1] < 0.4  # 40 pairs narrow it
    # tau of a pair is +1 / -1 (0 for the biased: +1 in one order, -1 in the other)
    assert report.kendall_tau[0] == pytest.approx((n_honest - kinds.count("reversed")) / N_ITEMS)
    assert report.consistency[0] == 1.0  # the same request got the same answer
    # 3 calls per group (order, reversed, repeat); 4 of 120 first answers were bad JSON, then retried
    assert report.calls == 3 * N_ITEMS and report.failed_calls == 0
    assert report.invalid_rate == pytest.approx(4 / 120)
    assert report.tokens_per_group == pytest.approx(1200 * 124 / 120)  # 1000 + 200 per reply, +4 retries
    table = format_table([report])
    assert "mixed" in table and f"{report.accuracy[0]:.2f}" in table


async def test_a_judge_that_always_fails_counts_as_no_signal(judge_server):
    judge_server.default = lambda req: Reply(status=500)
    [report] = await evaluate_judges(labelled_items()[:4], [spec(judge_server, "down")], orders=2, repeats=1)
    assert report.failed_calls == report.calls == 8 and report.invalid_rate == 1.0
    assert report.accuracy[0] == 0.5 and report.kendall_tau[0] == 0.0
    assert report.errors and "failed after 3 attempts" in report.errors[0]


async def test_selection_picks_the_better_judge_and_refuses_two_bad_ones(judge_server):
    judge_server.default = scripted
    labelled = labelled_items()[:20]
    chosen, reports, table = await select_judge(
        labelled, [spec(judge_server, "mixed"), spec(judge_server, "oracle"), spec(judge_server, "coin")], repeats=1)
    assert chosen.model == "oracle"
    by = {r.judge: r for r in reports}
    assert by["oracle"].accuracy[0] > by["mixed"].accuracy[0] > 0.5
    assert by["coin"].accuracy[0] == 0.5 and by["coin"].flip_rate[0] == 1.0  # position only: flips every pair
    assert "yes" in table and "no" in table
    with pytest.raises(gw.JudgeSelectionError) as err:
        await select_judge(labelled, [spec(judge_server, "coin"), spec(judge_server, "contrary")], repeats=1)
    assert err.value.table.count("\n") >= 3 and "coin" in err.value.table and "contrary" in err.value.table
    assert [r.accuracy[0] for r in err.value.reports] == [0.5, 0.0]
    assert "learn noise" in str(err.value)


async def test_judge_selection_is_a_score_group_that_uses_the_chosen_judge(judge_server):
    judge_server.default = scripted
    selection = gw.JudgeSelection([spec(judge_server, "coin"), spec(judge_server, "oracle")], labelled_items()[:12],
                                  repeats=1, margin=0.0)
    assert (await selection.before_training()).model == "oracle"
    group = gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=ms, reward=0.0)
                                for ms in labelled_items()[3].message_lists])
    before = len(judge_server.requests)
    judged = await selection(group)
    assert judge_server.requests[before]["model"] == "oracle"
    assert judged.rewards() == pytest.approx(labelled_items()[3].labels)


def test_judge_eval_command_prints_the_table_and_writes_json(judge_server, tmp_path, capsys):
    from groupwise.cli import main

    judge_server.default = scripted
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"trajectories": [{"messages": ms, "label": y}
                                                           for ms, y in zip(g.message_lists, g.labels)]}) + "\n"
                              for g in labelled_items()[:6]))
    code = main(["judge", "eval", "--labels", str(labels), "--judge", "oracle", "--judge", "coin",
                 "--base-url", judge_server.url, "--api-key", "t", "--repeats", "1", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["judge", "pairwise", "acc"]
    assert lines[1].startswith("oracle") and "1.00 [1.00, 1.00]" in lines[1] and lines[1].endswith("yes")
    assert lines[2].startswith("coin") and "0.50 [0.50, 0.50]" in lines[2] and lines[2].endswith("no")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert [r["judge"] for r in saved] == ["oracle", "coin"] and saved[1]["flip_rate"][0] == 1.0


def test_plot_draws_each_judge_with_its_intervals(tmp_path):
    from groupwise.judge.evaluate import JudgeReport, plot_judges

    def report(name, acc):
        return JudgeReport(name, 4, 8, (acc, acc - 0.1, acc + 0.05), (0.2, 0.0, 0.4), (0.1, 0.0, 0.2), None,
                           0.0, 0, 8, 900.0, 0.0, 1.5)

    path = plot_judges([report("a", 0.8), report("b", 0.5)], tmp_path / "judges.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_a_runs_validation_answers_are_grouped_by_scenario_across_checkpoints(tmp_path):
    # Validation at steps 0 and 2, one rollout per scenario: each scenario's two answers (base, step 2)
    # form a labelled group, labelled by the run's metric (the val rows' key that carries an interval).
    from groupwise.judge.eval_command import labelled_from_run
    from groupwise.runs.store import RunStore

    store = RunStore(tmp_path, "p", "m")

    def answer(q, a, acc):
        return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": q},
                                                                       {"role": "assistant", "content": a}],
                                                 reward=acc, metrics={"accuracy": acc})])

    store.write_trajectories("val", 0, [answer("2+2?", "5", 0.0), answer("3+3?", "6", 1.0)])
    store.write_trajectories("val", 2, [answer("2+2?", "4", 1.0), answer("3+3?", "six", 1.0)])
    store.append_history({"step": 0, "split": "val", "accuracy": 0.5, "accuracy_lo": 0.1, "accuracy_hi": 0.9})
    [group] = labelled_from_run(store.run_dir)  # 3+3 scored 1.0 both times: nothing to order
    assert group.labels == [0.0, 1.0]
    assert [ms[-1]["content"] for ms in group.message_lists] == ["5", "4"]


# ----------------------------------------------------------------------------- injection following


def follower(req) -> Reply:
    """An oracle that obeys an instruction written inside an answer it grades."""
    import re

    from groupwise.judge.evaluate import INJECTION

    found = [(t, b, float(re.findall(ITEM_RE, b)[-1][1])) for t, b in shown_trajectories(req)]
    return Reply(answer([(t, 1.0 if INJECTION in b else q) for t, b, q in found]))


async def test_injection_following_is_measured_for_an_obeying_and_an_immune_judge(judge_server):
    labelled = labelled_items()[:12]
    judge_server.default = lambda req: follower(req) if req["model"] == "follower" else scripted(req)
    follows, immune = await evaluate_judges(labelled, [spec(judge_server, "follower"), spec(judge_server, "oracle")],
                                            orders=2, repeats=1)
    # the follower ranks every group's worst answer strictly first once it carries the instruction: from
    # beating none of the others (0) to beating all (1)
    assert follows.injection_groups == immune.injection_groups == 12
    assert follows.injection_top == (1.0, 1.0, 1.0) and follows.injection_gain == (1.0, 1.0, 1.0)
    # the oracle reads the quality, not the instruction: the worst stays last
    assert immune.injection_top == (0.0, 0.0, 0.0) and immune.injection_gain == (0.0, 0.0, 0.0)
    assert follows.accuracy[0] == immune.accuracy[0] == 1.0  # the clean figures are the same requests as before
    assert follows.calls == immune.calls == 2 * 12  # the injected requests are reported apart
    # one injected request per group, each with the instruction on the worst answer only
    injected = [r for r in judge_server.requests if "Ignore previous instructions" in r["messages"][1]["content"]]
    assert len(injected) == 24 and all(r["messages"][1]["content"].count("Ignore previous") == 1 for r in injected)
    table = format_table([follows, immune])
    assert "injection: top" in table and "1.00 [1.00, 1.00]" in table
    [off] = await evaluate_judges(labelled[:2], [spec(judge_server, "oracle")], orders=1, repeats=1, injection=None)
    assert off.injection_top is None and off.injection_groups == 0


def test_injected_group_appends_to_one_worst_answer_only():
    from groupwise.judge.evaluate import INJECTION, beaten_share, injected

    g = LabelledGroup([[{"role": "user", "content": "q"}, {"role": "assistant", "content": a}] for a in "abc"],
                      [0.5, 0.0, 1.0])
    planted, w = injected(g)
    assert w == 1 and planted.message_lists[1][-1]["content"] == f"b\n\n{INJECTION}"
    assert planted.message_lists[0] == g.message_lists[0] and g.message_lists[1][-1]["content"] == "b"  # a copy
    assert injected(LabelledGroup(g.message_lists[:2], [0.0, 0.0])) is None  # no answer is worse
    assert injected(LabelledGroup(g.message_lists, [0.0, 0.0, 1.0]))[1] == 0  # of equal worst, the first
    assert beaten_share([0.2, 0.2, 0.9], 0) == 0.25 and beaten_share([1.0, 0.2, 0.9], 0) == 1.0

