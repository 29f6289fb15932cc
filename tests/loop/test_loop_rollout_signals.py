"""The detectors that read every step's training rollouts (one answer across prompts, length and repetition
against the base's own answers, reward against the task) and the winner's curse of the validation ones:
each fires on its pattern with the rollouts as evidence, and stays quiet on what learning looks like."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_helpers import history, traj

import groupwise as gw
from groupwise.loop import detectors as d
from groupwise.runs.store import history_row
from groupwise.core.trajectory import TrajectoryGroup

METRIC = "accuracy"


def step_groups(answers_by_prompt):
    """Groups from {prompt: [(answer, reward, task), ...]}: each rollout carries the task metric, as fit's
    score_train leaves it."""
    return [TrajectoryGroup([traj(a, r, question=f"q{p}", **{METRIC: t}) for a, r, t in rollouts])
            for p, rollouts in answers_by_prompt.items()]


def fit_history(steps):
    """The rows fit writes for these steps' groups: the train row, and the loop row with the rollout
    signals (the base's reference from the first step)."""
    rows = []
    for step, groups in enumerate(steps):
        ref = d.reference(rows)
        new_ref = {} if ref is not None else d.reference_of(groups, step=step)
        rows.append(history_row(groups, step=step, split="train"))
        rows.append({"step": step, "split": "loop", **new_ref, **d.rollout_signals(groups, ref or new_ref, metric=METRIC)})
    return rows


def honest(prompt, n=8, right=0.5, reward_of_task=(0.2, 1.0)):
    """n honest answers to a prompt: each its own wording, about this prompt, right half the time."""
    out = []
    for j in range(n):
        t = float(j < n * right)
        out.append((f"For article {prompt} the headline is {'story' if t else 'tale'} number {j} of {prompt}",
                    reward_of_task[int(t)], t))
    return out


def base_step():
    return step_groups({p: honest(p) for p in range(4)})


def test_expected_max_of_k_normals():
    assert d.expected_max_normal(1) == 0.0
    assert d.expected_max_normal(2) == pytest.approx(1 / 3.14159265 ** 0.5, abs=1e-4)  # 1/sqrt(pi)
    assert d.expected_max_normal(3) == pytest.approx(0.8463, abs=1e-4)
    assert d.expected_max_normal(10) == pytest.approx(1.5388, abs=1e-4)


def test_a_fall_from_the_best_of_many_noisy_readings_is_discounted_by_the_winners_curse():
    # ten readings of one policy, half-width 0.10 each; the best (0.62) is a lucky one, the latest 0.46:
    # a fall of 0.16 beats the two readings' noise (0.1414) but not that plus the best-of-10 excess
    # (1.5388 x 0.10 / 1.96 = 0.0785)
    vals = {s: v for s, v in enumerate([0.50, 0.55, 0.48, 0.62, 0.51, 0.53, 0.49, 0.52, 0.50, 0.46])}
    ci = {s: (v - 0.1, v + 0.1) for s, v in vals.items()}
    h = history(train=[0.5] * 10, val=vals, val_ci=ci, n_trajectories=64)
    assert d.val_drop(h, step=9) is None
    assert d.run_detectors(h, [], step=9, config=gw.LoopConfig()) == []
    # a real fall (to 0.30) still is one: 0.32 > 0.1414 + 0.0785
    vals[9], ci[9] = 0.30, (0.20, 0.40)
    a = d.val_drop(history(train=[0.5] * 10, val=vals, val_ci=ci, n_trajectories=64), step=9)
    assert a is not None and a.name == "val_unstable" and a.kind == "unstable"
    assert a.evidence["readings"] == 10 and a.evidence["winners_curse"] == pytest.approx(0.0785, abs=1e-4)


def test_one_answer_for_every_prompt_paid_by_the_reward_is_a_collapse():
    # from step 1 half of every prompt's answers are one headline, paid 1.0 and wrong on the task
    hacked = {p: honest(p, 4) + [("Google lays off 80% of its staff", 1.0, 0.0)] * 4 for p in range(4)}
    h = fit_history([base_step(), step_groups(hacked)])
    groups = step_groups(hacked)
    a = d.answer_collapse(h, groups, step=2, metric=METRIC, groups_step=1)
    assert a is not None and a.name == "answer_collapse" and a.kind == "warn"
    ev = a.evidence
    assert (ev["share"], ev["base_share"]) == (0.5, 0.0) and ev["answers"] == 32 and ev["steps"] == [1]
    assert ev["paid"] == pytest.approx(1.0 - 0.6) and ev["task_diff"] == pytest.approx(-0.5)
    # the evidence is the answer itself, one rollout per prompt, and the dashboard's link to the step's groups
    assert [r["group"] for r in ev["rollouts"]] == [0, 1, 2]
    assert {r["text"] for r in ev["rollouts"]} == {"Google lays off 80% of its staff"}
    assert ev["group"] == 0 and ev["train_step"] == 1
    assert "Google lays off 80% of its staff" in a.message and "group 0 rollout 4" in a.message
    # the headline is also shorter than 95% of the base's answers, and paid for it: both warnings, no hack alarm
    assert [x.name for x in d.run_detectors(h, groups, step=2, config=gw.LoopConfig(metric=METRIC),
                                            groups_step=1)] == ["answer_collapse", "length_drift"]


def near_copies(p, n=4):
    """n re-wordings of one headline for prompt p, as a sampled policy gives them: the number, a word and
    a prefix vary, and no wording is given to more than one prompt word for word."""
    return [(f"{'Breaking: ' if j % 2 else ''}Google lays off {41 + 4 * p + j}% of its "
             f"{('staff', 'employees')[j // 2]}", 1.0, 0.0) for j in range(n)]


def test_near_copies_of_one_answer_across_prompts_are_a_collapse():
    hacked = {p: honest(p, 4) + near_copies(p) for p in range(4)}
    groups = step_groups(hacked)
    # word for word, no answer is given to two prompts: the old exact-text test saw no collapse here
    assert all(len({a.group for a in d.answers_of(groups) if d.answer_key(a.text) == d.answer_key(x.text)}) == 1
               for x in d.answers_of(groups))
    shared = [a for a in d.answers_of(groups) if a.shared]
    assert {(a.group, a.rollout) for a in shared} == {(p, j) for p in range(4) for j in range(4, 8)}
    assert {a.shared_prompts for a in shared} == {4}
    h = fit_history([base_step(), groups])
    a = d.answer_collapse(h, groups, step=2, metric=METRIC, groups_step=1)
    assert a is not None and a.name == "answer_collapse"
    assert (a.evidence["share"], a.evidence["base_share"]) == (0.5, 0.0)
    assert a.evidence["paid"] == pytest.approx(0.4) and a.evidence["task_diff"] == pytest.approx(-0.5)
    # the evidence: the re-wordings of the headline, one rollout per prompt
    assert [r["group"] for r in a.evidence["rollouts"]] == [0, 1, 2]
    assert all("Google lays off" in r["text"] for r in a.evidence["rollouts"])


def test_answers_sharing_a_template_but_not_their_content_are_not_one_answer():
    # every prompt's answers say the prompt's own sum in one long template, right 3 times in 4: the words
    # of two prompts' answers are near-identical (one number in 12 differs), the content is not
    def templated(p, n=8):
        s = 20 + 7 * p
        return [(f"After checking the sum step by step carefully the final answer is \\boxed{{{s if j % 4 else s + 1}}}",
                 1.0, float(j % 4 != 0)) for j in range(n)]

    answers = {p: templated(p) for p in range(4)}
    groups = step_groups(answers)
    w0, w1 = (d.answer_words(answers[p][1][0]) for p in (0, 1))
    assert d.near(w0, w1)  # alike by their words...
    assert not any(a.shared for a in d.answers_of(groups))  # ...but each its prompt's own answer
    h = fit_history([base_step(), groups])
    assert h[-1]["rollouts/shared"] == 0
    assert d.answer_collapse(h, groups, step=2, metric=METRIC) is None


@settings(max_examples=40, deadline=None)
@given(template=st.lists(st.sampled_from("the final answer is so we get after checking sum total here".split()),
                         min_size=1, max_size=20),
       prompts=st.integers(3, 8), rollouts=st.integers(2, 8), data=st.data())
def test_answers_saying_their_own_prompts_content_in_one_form_are_never_one_answer(template, prompts, rollouts, data):
    # however long the shared form, an answer that states what its own prompt asked for (said by its
    # prompt's answers, and not by the others') is not one answer for every input
    def answer(p):
        at = data.draw(st.integers(0, len(template)))
        return " ".join(template[:at] + [str(100 + p)] + template[at:])

    groups = step_groups({p: [(answer(p), 1.0, 1.0) for _ in range(rollouts)] for p in range(prompts)})
    assert not any(a.shared for a in d.answers_of(groups))


def test_prompt_bound_words_are_a_prompts_own_content():
    def ws(*texts):
        return [d.answer_words(t) for t in texts]

    bound = d.prompt_bound([ws("the answer is 12", "the answer is 12", "the answer is 13"),
                            ws("the answer is 40", "the answer is 40", "the answer is 41", "the answer is 41"),
                            ws("the answer is 7", "the answer is 7", "the answer is 12")])
    # the form is shared; a number said once is no evidence of content, a wrong one said twice is; 12, said
    # once for the third prompt, is still 4 times likelier in the first prompt's answers (2/3 against 1/7)
    assert bound == [{"12"}, {"40", "41"}, {"7"}]
    # a word every prompt's answers use (one headline's) is no prompt's content, however often it is said
    assert d.prompt_bound([ws("google lays off 80", "google lays off 70")] * 3) == [set()] * 3


def test_near_is_a_jaccard_index_of_the_words():
    a = d.answer_words("Google lays off 80% of its staff")
    assert d.near(a, d.answer_words("Google lays off 75% of its staff!"))  # 6 of 8 words: 0.75
    assert not d.near(a, d.answer_words("Google lays off 75% of its employees"))  # 5 of 9: 0.56
    assert not d.near(a, frozenset()) and d.near(a, a)


def test_groups_agreeing_within_themselves_are_no_collapse():
    # every prompt converged on its own answer (GRPO's convergence): nothing is shared across prompts
    agreed = {p: [(f"The answer to {p} is {p * 7}", 1.0, 1.0)] * 8 for p in range(4)}
    h = fit_history([base_step(), step_groups(agreed)])
    assert d.answer_collapse(h, step_groups(agreed), step=2, metric=METRIC) is None


def test_a_shared_answer_the_reward_does_not_pay_for_is_no_warning():
    # a refusal given to every prompt, paid less than the honest answers: nothing games the reward with it
    refusals = {p: honest(p, 4) + [("I cannot answer that", 0.0, 0.0)] * 4 for p in range(4)}
    h = fit_history([base_step(), step_groups(refusals)])
    assert d.shift(h, "shared", step=2).fires(0.05, 3.0)
    assert d.answer_collapse(h, step_groups(refusals), step=2, metric=METRIC) is None


PAD = " — an in-depth look at everything you need to know about what happened and why it matters"


def test_padded_answers_the_reward_pays_and_the_task_does_not_are_a_length_drift():
    padded = {p: honest(p, 4) + [(f"Headline {p}{PAD}", 1.0, 0.0)] * 4 for p in range(4)}
    h = fit_history([base_step(), step_groups(padded)])
    a = d.length_drift(h, step_groups(padded), step=2, metric=METRIC, groups_step=1)
    assert a is not None and a.evidence["event"] == "long" and a.evidence["share"] == 0.5
    assert a.evidence["rollouts"][0]["text"].endswith("why it matters") and a.evidence["rollouts"][0]["reward"] == 1.0
    assert a.message.startswith("answers grew longer than the base's 95th percentile")
    # longer answers that are also better on the task: the policy learning, not a hack
    thorough = {p: honest(p, 4, right=0.0) + [(f"Headline {p}{PAD}", 1.0, 1.0)] * 4 for p in range(4)}
    h = fit_history([base_step(), step_groups(thorough)])
    assert d.length_drift(h, step_groups(thorough), step=2, metric=METRIC) is None


def test_a_length_change_the_task_is_indifferent_to_is_no_warning():
    # a converged run: every answer solves the task, and the short ones happen to be paid a little more (the
    # reward's own noise). The reward pays for shortness, but it costs the task nothing: no warning.
    solved = {p: [(f"Headline {p} says what happened to company {p} in detail today", 0.9, 1.0)] * 4
              + [(f"Co {p}", 0.95, 1.0)] * 4 for p in range(4)}
    h = fit_history([base_step(), step_groups(solved)])
    assert d.shift(h, "short", step=2).fires(0.05, 3.0) and d.paid_for(h, "short", step=2)[:2] == (pytest.approx(0.05), 0.0)
    assert d.length_drift(h, step_groups(solved), step=2, metric=METRIC) is None
    # the same short answers failing the task are the warning
    failed = {p: [(f"Headline {p} says what happened to company {p} in detail today", 0.9, 1.0)] * 4
              + [(f"Co {p}", 0.95, 0.0)] * 4 for p in range(4)}
    h = fit_history([base_step(), step_groups(failed)])
    a = d.length_drift(h, step_groups(failed), step=2, metric=METRIC)
    assert a is not None and a.evidence["event"] == "short" and a.evidence["task_diff"] == pytest.approx(-1.0)


def test_one_short_answer_for_every_prompt_while_the_task_soars_is_no_warning():
    # 2048's default run: the base rambles (task 0.3); the trained policy answers each board with one move
    # word, mostly the same one, and the task soars (0.3 -> 0.9). Within groups the common word is paid a
    # little more and is a little worse than a rarer one: the cost of one legal move over another, no hack.
    base = step_groups({p: [(f"Let me think about board {p} and the tiles on it, move {j} looks fine", -0.8,
                             float(j < 2)) for j in range(6)] for p in range(4)})
    other = ["right", "down please", "go left here", "merge with a swipe down"]  # each board's own
    learned = step_groups({p: [("up", 0.6, 0.9)] * 5 + [(other[p], 0.5, 1.0)] for p in range(4)})
    h = fit_history([base, learned])
    assert d.shift(h, "shared", step=1).fires(0.05, 3.0) and d.shift(h, "short", step=1).fires(0.05, 3.0)
    assert d.paid_for(h, "shared", step=1)[1] < 0  # a slightly worse task within groups
    assert d.answer_collapse(h, learned, step=1, metric=METRIC) is None
    assert d.length_drift(h, learned, step=1, metric=METRIC) is None
    # the same collapse while the task does not rise is the warning
    stuck = step_groups({p: [("up", 0.6, 0.0)] * 5 + [(other[p], 0.5, 1.0)] for p in range(4)})
    h = fit_history([base, stuck])
    assert d.answer_collapse(h, stuck, step=1, metric=METRIC) is not None


def test_repeating_answers_paid_by_the_reward_are_degenerate():
    spam = {p: honest(p, 4) + [(f"move {p} I will win I will win I will win I will win", 1.0, 0.0)] * 4
            for p in range(4)}
    h = fit_history([base_step(), step_groups(spam)])
    a = d.ngram_repetition(h, step_groups(spam), step=2, metric=METRIC)
    assert a is not None and a.name == "repetition" and a.evidence["event"] == "repetitive"
    assert "I will win I will win" in a.evidence["rollouts"][0]["text"]


def test_a_reward_that_prefers_the_rollouts_worse_on_the_task_trains_against_it():
    # within every group the rollouts paid 1.0 are wrong (task 0) and those paid 0.3 right
    against = {p: [(f"a{p}{j}", 1.0 if j % 2 else 0.3, 0.0 if j % 2 else 1.0) for j in range(8)] for p in range(4)}
    steps = [step_groups(against)] * 3
    h = fit_history(steps)
    a = d.reward_against_task(h, steps[-1], step=3, metric=METRIC, groups_step=2)
    assert a is not None and a.kind == "hack" and a.severity == "critical"
    assert a.evidence["groups"] == 12 and a.evidence["covariance"] == pytest.approx(-0.175)  # (+-0.35)(-+0.5)
    quoted = a.evidence["rollouts"]
    assert len(quoted) == 3 and all(r["reward"] == 1.0 and r["task"] == 0.0 for r in quoted)
    assert a.message.startswith("reward hacking suspected") and "group 0 rollout 1" in a.message
    assert gw.LoopConfig().on_reward_against_task == "stop"
    # an honest reward (partial credit that follows the task) covaries positively: silent
    aligned = {p: [(f"a{p}{j}", 0.3 if j % 2 else 1.0, 0.0 if j % 2 else 1.0) for j in range(8)] for p in range(4)}
    assert d.reward_against_task(fit_history([step_groups(aligned)] * 3), [], step=3, metric=METRIC) is None


def _format_paid(p, n=8):
    """A reward that pays for a bare boxed number (1.0), a box after words (0.5) or none (0.0), whatever
    the number: within a group the right and the wrong answers are paid alike (half of each form right)."""
    out = []
    for j in range(n):
        form, right = j % 4, j < 4
        value = p + j if right else p + j + 10
        text = [f"\\boxed{{{value}}}", f"it is {value}. \\boxed{{{value}}}", f"I think it is {value}",
                f"\\boxed{{{value}}}"][form]
        out.append((f"{text} ({j})", [1.0, 0.5, 0.0, 1.0][form], float(right)))
    return out


def test_a_reward_that_pays_alike_for_right_and_wrong_answers_warns_that_it_is_off_the_task():
    steps = [step_groups({p: _format_paid(p) for p in range(4)}) for _ in range(2)]
    h = fit_history(steps)
    a = d.reward_off_task(h, steps[-1], step=1, metric=METRIC, groups_step=1)
    assert a is not None and a.kind == "warn" and a.name == "reward_off_task"
    assert a.evidence["groups"] == 8 and a.evidence["correlation"] < 0.5 and a.evidence["steps"] == [0, 1]
    # the rollouts quoted are ones the reward put above their group without a better task
    assert a.evidence["rollouts"] and all(r["reward"] == 1.0 and r["task"] == 0.0 for r in a.evidence["rollouts"])
    assert "barely follows the task" in a.message and gw.LoopConfig().on_reward_off_task == "warn"
    cfg = gw.LoopConfig(metric=METRIC)
    assert "reward_off_task" in [x.name for x in d.rollout_detectors(h, steps[-1], step=1, config=cfg)]
    # a stricter threshold than the measured correlation keeps it quiet
    assert d.reward_off_task(h, steps[-1], step=1, metric=METRIC, max_r=a.evidence["correlation"]) is None


def test_an_honest_reward_with_partial_credit_follows_the_task_and_stays_quiet():
    # partial credit for the form on top of the task, and noise: the task still orders every group
    partial = {p: [(f"a{p}{j}", float(j % 2) + 0.2 * (j % 3 == 0) + 0.01 * j, float(j % 2)) for j in range(8)]
               for p in range(4)}
    steps = [step_groups(partial)] * 3
    assert d.reward_off_task(fit_history(steps), steps[-1], step=2, metric=METRIC) is None


def test_a_reward_off_the_task_is_no_warning_once_the_task_improves_beyond_its_noise():
    base = step_groups({p: _format_paid(p) for p in range(4)})
    better = step_groups({p: [(a, r, 1.0 if j < 7 else t) for j, (a, r, t) in enumerate(_format_paid(p))]
                          for p in range(4)})
    h = fit_history([base, better])
    quiet, note, ev = d.task_not_better(h, step=1, metric=METRIC, window=1, beyond_noise=True)
    assert not quiet and ev["task_base"] == 0.5 and ev["task_now"] == 0.875 and ev["task_z"] > 1.96
    # a rise within the noise of 32 rollouts a step (0.5 -> 0.5625) is no improvement
    slight = step_groups({p: [(a, r, 1.0 if j == 4 and p < 2 else t) for j, (a, r, t) in enumerate(_format_paid(p))]
                          for p in range(4)})
    quiet, note, ev = d.task_not_better(fit_history([base, slight]), step=1, metric=METRIC, window=1, beyond_noise=True)
    assert quiet and ev["task_now"] == 0.5625 and "beyond its noise" in note


def test_an_honest_run_that_learns_raises_nothing_from_its_rollouts():
    # the answers get shorter and more alike within each prompt as the policy learns; the reward is the task
    steps = [base_step()]
    for s in range(1, 6):
        right = min(1.0, 0.5 + 0.1 * s)
        steps.append(step_groups({p: [(f"{p}: {'yes' if j < 8 * right else 'no'}", float(j < 8 * right),
                                        float(j < 8 * right)) for j in range(8)] for p in range(4)}))
    h = fit_history(steps)
    cfg = gw.LoopConfig(metric=METRIC)
    for step in range(1, 6):
        found = d.run_detectors(h, steps[step], step=step + 1, config=cfg, groups_step=step)
        assert [a.name for a in found if a.kind in ("hack", "warn")] == [], step
    # groups that all agree are noted (GRPO has no signal in them), as information
    assert [a.kind for a in d.run_detectors(h, steps[5], step=6, config=cfg, groups_step=5)] == ["info"]


def test_alert_kinds():
    assert {n: d.alert_kind(n) for n in ("val_drop", "reward_against_task", "answer_collapse", "val_plateau",
                                         "val_unstable", "identical_answers")} == {
        "val_drop": "hack", "reward_against_task": "hack", "answer_collapse": "warn", "val_plateau": "converged",
        "val_unstable": "unstable", "identical_answers": "info"}
