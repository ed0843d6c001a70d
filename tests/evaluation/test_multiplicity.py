"""Many classes, many guards: Holm and Benjamini-Hochberg, per-class McNemar, the per-class guard's correction."""

import pytest
import yaml

from tuneproof.context import parse_study
from tuneproof.errors import TuneproofError
from tuneproof.evaluation.compare import AUTO_HOLM_MIN_CLASSES, paired_compare
from tuneproof.evaluation.multiplicity import benjamini_hochberg, holm
from tuneproof.recipes.init import template_text
from tuneproof.study import Eval, Hypothesis

EVAL = Eval()

# Benjamini & Hochberg (1995), section 4.2: 15 p-values of a clinical trial.
BH_1995 = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528]
BH_1995 += [0.7590, 1.0000]


def test_holm_small_list_by_hand():
    # m = 4, sorted: 0.005*4 = 0.02 <= .05 reject; 0.01*3 = 0.03 reject; 0.03*2 = 0.06 > .05 stop.
    # adjusted (running max): 0.02, 0.03, 0.06, max(0.06, 0.04*1) = 0.06
    adj, rej = holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rej == [True, False, False, True]


def test_bh_small_list_by_hand():
    # m = 4, k * .05 / 4 = .0125, .025, .0375, .05; the largest p (0.04, k = 4) is <= .05: all four rejected.
    # q (running min from the top): 4*.04/4 = .04; min(.04, 4*.03/3 = .04); min(.04, 4*.01/2 = .02); 4*.005/1 = .02
    q, rej = benjamini_hochberg([0.01, 0.04, 0.03, 0.005])
    assert q == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert rej == [True, True, True, True]


def test_bh_1995_worked_example_and_holm_on_it():
    # BH: k * .05 / 15 for k = 4 is .01333 >= .0095, for k = 5..15 every p_(k) exceeds its line: 4 rejections,
    # as the paper reports. Holm: .0001*15, .0004*14, .0019*13 = .0247 <= .05, .0095*12 = .114 > .05: 3.
    _, bh = benjamini_hochberg(BH_1995)
    assert [i for i, r in enumerate(bh) if r] == [0, 1, 2, 3]
    adj, ho = holm(BH_1995)
    assert [i for i, r in enumerate(ho) if r] == [0, 1, 2]
    assert adj[:4] == pytest.approx([0.0015, 0.0056, 0.0247, 0.114])
    assert holm([]) == ([], []) and benjamini_hochberg([]) == ([], [])


def _study(table):
    """table: {class: (n, base_right, cand_right)}; each class's first examples are right -> records."""
    base, cand = [], []
    names = list(table)
    for ci, cls in enumerate(names):
        n, b_right, c_right = table[cls]
        wrong = names[(ci + 1) % len(names)]
        for i in range(n):
            rid = f"{cls}-{i}"
            base.append({"id": rid, "reference": cls, "prediction": cls if i < b_right else wrong})
            cand.append({"id": rid, "reference": cls, "prediction": cls if i < c_right else wrong})
    return base, cand


def _guard(table, **guard):
    hyp = Hypothesis(
        behaviour="b",
        task="classification",
        success={"metric": "accuracy", "min_gain": 0.0},
        guards=[{"metric": "per_class_recall", "max_drop": 0.0, **guard}],
    )
    base, cand = _study(table)
    r = paired_compare(base, cand, "classification", required_fields=[], eval_cfg=EVAL, hypothesis=hyp, iterations=300)
    return r, r["verdicts"][1]


def _classes77(drop_one: bool):
    # 77 classes of 40 examples, 36 right in the baseline. c01..c05 each lose 5 examples (noise-sized: exact
    # McNemar 5 broken / 0 fixed, p = 2 * 0.5**5 = 0.0625); c00, when planted, loses 26 (p = 2 * 0.5**26).
    table = {f"c{i:02d}": (40, 36, 36) for i in range(77)}
    for i in range(1, 6):
        table[f"c{i:02d}"] = (40, 36, 31)
    if drop_one:
        table["c00"] = (40, 36, 10)
    return table


def test_planted_drop_of_one_class_among_77_fails_under_holm_and_noise_does_not():
    r, g = _guard(_classes77(drop_one=True))
    tests = r["per_class_tests"]
    assert tests["family_size"] == 77 and tests["moved_bh"] == ["c00"]
    assert tests["classes"]["c01"]["p_value"] == pytest.approx(0.0625)
    assert tests["classes"]["c00"]["p_value"] == pytest.approx(2 * 0.5**26)
    assert tests["classes"]["c00"]["p_holm"] == pytest.approx(77 * 2 * 0.5**26)
    corr = g["correction"]
    assert corr["method"] == "holm" and corr["requested"] == "auto" and corr["family_size"] == 77
    assert corr["moved_bh"] == ["c00"]
    # uncorrected: each noise class's own 95% CI lies below 0, so without the correction all six fail
    assert corr["failing_uncorrected"] == ["c00", "c01", "c02", "c03", "c04", "c05"]
    assert corr["verdict_uncorrected"] == "fail"
    items = {it["name"]: it for it in g["items"]}
    assert items["c00"]["verdict"] == "fail" and items["c00"]["broken"] == 26
    assert [items[f"c0{i}"]["verdict"] for i in range(1, 6)] == ["inconclusive"] * 5
    assert items["c01"]["verdict_uncorrected"] == "fail" and items["c01"]["p_holm"] == pytest.approx(1.0)
    assert g["verdict"] == "fail" and g["detail"].startswith("failing classes: c00 ")
    assert "Holm over 77 classes, exact McNemar per class" in g["detail"]
    assert "5 fail on their own CI but not after Holm: c01 (McNemar p 0.0625, Holm p 1 over 77)" in g["detail"]


def test_noise_alone_among_77_classes_does_not_fail_the_guard_unless_uncorrected():
    _, g = _guard(_classes77(drop_one=False))
    assert g["correction"]["method"] == "holm"
    assert g["correction"]["verdict_uncorrected"] == "fail" and g["correction"]["moved_bh"] == []
    assert g["verdict"] == "inconclusive"
    _, g = _guard(_classes77(drop_one=False), correction="none")
    assert g["correction"]["method"] == "none" and g["verdict"] == "fail"
    assert [it["name"] for it in g["items"] if it["verdict"] == "fail"] == ["c01", "c02", "c03", "c04", "c05"]


def test_few_classes_keep_the_uncorrected_verdict_unless_holm_is_asked():
    # 3 classes (< AUTO_HOLM_MIN_CLASSES): B loses 5 of 40, fails on its own CI; Holm p = min(1, 2 * .0625)
    assert AUTO_HOLM_MIN_CLASSES == 10
    table = {"A": (40, 36, 36), "B": (40, 36, 31), "C": (40, 36, 36)}
    _, g = _guard(table)
    assert g["correction"]["method"] == "none" and g["verdict"] == "fail"
    assert {it["name"]: it["p_value"] for it in g["items"]} == pytest.approx({"A": 1.0, "B": 0.0625, "C": 1.0})
    _, g = _guard(table, correction="holm")
    assert g["correction"]["method"] == "holm" and g["verdict"] == "inconclusive"
    assert {it["name"]: it["p_holm"] for it in g["items"]}["B"] == pytest.approx(0.1875)  # 3 * 0.0625


def test_floor_failure_is_not_softened_by_holm():
    table = {"A": (40, 36, 36), "B": (40, 36, 31), "C": (40, 36, 36)}
    _, g = _guard(table, correction="holm", floor=0.8)  # B's candidate recall 31/40 = 0.775 < 0.8
    assert g["verdict"] == "fail" and g["detail"].startswith("failing classes: B ")


def test_holm_on_an_aggregate_guard_names_the_key():
    study = yaml.safe_load(template_text("classification"))
    study["hypothesis"]["guards"] = [{"metric": "macro_f1", "max_drop": 0.01, "correction": "holm"}]
    with pytest.raises(TuneproofError, match=r"hypothesis.guards\[0\].correction: holm applies to a per_class_"):
        parse_study(study)
    study["hypothesis"]["guards"] = [{"metric": "per_class_recall", "max_drop": 0.01, "correction": "bonferroni"}]
    with pytest.raises(TuneproofError, match=r"correction"):
        parse_study(study)


def test_compare_screen_and_dossier_show_the_correction_beside_the_uncorrected_numbers():
    from tuneproof.deliver.dossier import per_class_blocks
    from tuneproof.deliver.dossier.comparisons import _corrected_guard, _failing_items
    from tuneproof.deliver.dossier.render import _md_blocks
    from tuneproof.evaluation.screen import guard_lines

    r, g = _guard(_classes77(drop_one=True))
    lines = guard_lines(g)
    assert lines[0] == "1 of 77 classes fail (judged on support >= 1)"
    assert lines[1].startswith("    c00: recall 0.900 -> 0.250, delta -0.650 [-0.792, -0.475], support 40, ")
    assert "McNemar p 3.0e-8 (26 broken, 0 fixed), Holm p 2.3e-6, BH q 2.3e-6" in lines[1]
    assert lines[-1] == (
        "    correction used by the verdict: Holm over 77 classes (exact McNemar per class, family-wise error 0.05); "
        "uncorrected: fail (6 failing: c00, c01, c02, c03, c04, c05); moved (Benjamini-Hochberg, FDR 0.05): 1: c00"
    )
    guard = _corrected_guard(r)
    assert guard is g
    blocks = per_class_blocks(r["per_class"], "recall", _failing_items(r, "per_class"), guard)
    assert blocks[0]["text"].startswith("guard: per_class_recall drop <= 0: correction used by the verdict: Holm")
    assert "exact McNemar (1947) per class" in blocks[1]["text"]
    table = blocks[3]
    assert table["cols"][-6:] == ["McNemar p", "Holm p", "BH q", "moved (BH)", "uncorrected", "verdict"]
    rows = {row[0]: row for row in table["rows"]}
    assert rows["c00"][-6:] == ["3.0e-8", "2.3e-6", "2.3e-6", "yes", "fail", "fail"]
    # BH q of c01..c05 (ranks 2-6 of 77): min over ranks >= 6 of 77 p / rank = 77 * 0.0625 / 6 = 0.8021
    assert rows["c01"][-6:] == ["0.0625", "1.0000", "0.8021", "", "fail", "inconclusive"]
    md = "\n".join(_md_blocks(blocks))
    assert "| McNemar p | Holm p | BH q |" in md


def test_first_screen_says_holm_decided():
    from tuneproof.deliver.dossier import criteria_table

    r, g = _guard(_classes77(drop_one=False))
    row = criteria_table(r["verdicts"])["rows"][1]
    assert row[1] == "inconclusive"
    assert row[-1].endswith(
        "; decided with Holm over 77 classes (exact McNemar per class); uncorrected: fail, 5 failing"
    )
