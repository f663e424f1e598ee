import math

import pytest

from verispec.theory import expected_tokens, interpolate_cost, optimal_gamma, predicted_speedup, table


def test_known_values():
    assert expected_tokens(0.8, 5) == pytest.approx(3.689, abs=5e-4)  # (1 - 0.8^6) / 0.2
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.0, 7) == 1.0  # nothing accepted: the recovered token only
    assert expected_tokens(1.0, 4) == 5.0  # all accepted: gamma + bonus
    assert expected_tokens(0.9999999, 4) == pytest.approx(5.0, rel=1e-5)  # continuous at alpha -> 1


def test_matches_the_sum_it_stands_for():
    for a in (0.3, 0.7, 0.95):
        for g in range(0, 9):
            assert expected_tokens(a, g) == pytest.approx(sum(a**i for i in range(g + 1)))


def test_speedup_and_optimal_gamma():
    assert predicted_speedup(0.8, 5, 0.0) == pytest.approx(expected_tokens(0.8, 5))
    assert predicted_speedup(0.8, 4, 0.25) == pytest.approx(3.3616 / 2.0)
    # Free drafts and perfect acceptance: draft as far as allowed; costly drafts and poor acceptance: draft one.
    assert optimal_gamma(1.0, 0.0, max_gamma=8) == 8
    assert optimal_gamma(0.3, 0.5) == 1
    g = optimal_gamma(0.8, 0.1)
    assert all(predicted_speedup(0.8, g, 0.1) >= predicted_speedup(0.8, k, 0.1) for k in range(1, 17))


def test_bad_input_and_table():
    with pytest.raises(ValueError):
        expected_tokens(1.5, 3)
    with pytest.raises(ValueError):
        predicted_speedup(0.5, 3, -1)
    md = table([0.5, 0.7, 0.85, 0.95], [1, 2, 4, 8], c=0.2)
    assert md.count("\n") == 5 and "optimal γ" in md
    assert not math.isnan(predicted_speedup(0.5, 0, 0.2))


def test_theory_command(capsys):
    from verispec.cli import main

    assert main(["theory", "--alpha", "0.8", "--gamma", "5", "--c", "0"]) == 0
    out = capsys.readouterr().out
    assert "3.689 expected tokens" in out and "| 0.95 |" in out
    with pytest.raises(SystemExit) as e:
        main(["theory", "--alpha", "2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["verispec: error: alpha must be in [0, 1], got 2.0"]


def test_verification_cost_curve():
    cost = interpolate_cost([(4, 1.25), (1, 1.0), (2, 1.1), (8, 1.55)])
    assert cost(1) == 1.0 and cost(2) == pytest.approx(1.1) and cost(3) == pytest.approx(1.175)
    assert cost(6) == pytest.approx(1.4) and cost(12) == pytest.approx(1.85)  # beyond 8: the last slope
    assert interpolate_cost([])(9) == 1.0 and interpolate_cost([(1, 1.0)])(9) == 1.0
    flat = predicted_speedup(0.9, 4, 0.2)
    assert predicted_speedup(0.9, 4, 0.2, cost) == pytest.approx(flat * 1.8 / (0.8 + cost(5)))
    # a verification that grows with its width moves the optimum to shorter drafts
    steep = interpolate_cost([(1, 1.0), (16, 4.0)])
    assert optimal_gamma(0.9, 0.1, verify_cost=steep) < optimal_gamma(0.9, 0.1)


def test_medusa_widths_is_the_best_tree_by_brute_force():
    import itertools

    from verispec.theory import medusa_widths

    accept = [[0.5, 0.15, 0.05, 0.02], [0.35, 0.1, 0.05, 0.02], [0.2, 0.08, 0.03, 0.01]]
    curves = {"flat": lambda k: 1.0, "cpu": lambda k: 1.0 + 0.12 * (k - 1), "steep": lambda k: float(k)}
    for name, cost in curves.items():
        for budget in (1, 4, 8, 16):
            best, speed = (), 1.0 / cost(1)
            for depth in range(1, 4):
                for widths in itertools.product(range(1, 5), repeat=depth):
                    level, nodes, reach, tokens = 1, 0, 1.0, 1.0
                    for d, w in enumerate(widths):
                        level *= w
                        nodes += level
                        reach *= sum(accept[d][:w])
                        tokens += reach
                    s = tokens / (0.05 + cost(nodes + 1))
                    if nodes <= budget and s > speed + 1e-12:
                        best, speed = widths, s
            got, got_speed = medusa_widths(accept, budget, 0.05, cost)
            assert got_speed == pytest.approx(speed) and got == best, (name, budget, got, best)
    assert medusa_widths(accept, 16, 0.05, curves["steep"])[0] == ()  # verifying costs more than it brings
    assert medusa_widths([[0.9]], 1, 0.0, curves["flat"]) == ((1,), pytest.approx(1.9))
