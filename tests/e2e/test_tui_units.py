"""The pure parts of the app: bars, sparklines, table columns, endpoint lines, the legend."""

from __future__ import annotations

from supervisor import display
from supervisor.engine import Event
from supervisor.model import DatasetView, EndpointMetrics, Quantity
from supervisor.rates import MIN_RESPONSES, WINDOW_10M
from tui.screens.help import LEGEND
from tui.widgets.dataset_table import column_widths, dataset_cells
from tui.widgets.events import events_text
from tui.widgets.format import bar, sparkline
from tui.widgets.serving import endpoint_line


def test_bar_is_exact_in_eighths_and_capped() -> None:
    assert bar(0.0, 6) == "░░░░░░"
    assert bar(0.5, 6) == "███░░░"
    assert bar(1 / 48, 6) == "▏░░░░░"
    assert bar(1.07, 6) == "██████"
    assert len(bar(0.33, 10)) == 10


def test_sparkline_scales_to_its_own_maximum() -> None:
    assert sparkline([], 10) == ""
    assert sparkline([0, 0], 10) == "▁▁"
    line = sparkline([1, 2, 4, 8], 10)
    assert line[-1] == "█" and line[0] < line[-1]
    assert len(sparkline(list(range(1, 40)), 14)) == 14


def test_the_legend_states_the_engines_rate_window() -> None:
    # The dashboard's tok/s and req/s are the engine's headline rates: its 10-minute window,
    # shown from MIN_RESPONSES responses on (not "the last minute").
    meaning = dict(LEGEND)["tok/s, req/s"]
    assert f"last {WINDOW_10M / 60:g} minutes" in meaning
    assert f"from {MIN_RESPONSES} responses" in meaning


def test_the_widest_budget_fits_its_column_on_both_screens() -> None:
    # "95.6 k / 100 k" was cut to "95.6 k / 100…" at 160 columns.
    for used, budget in ((95_600, 100_000), (99_900_000, 100_000_000), (10_712_345, 10_000_000)):
        ds = DatasetView(name="B2", path="x", completion_tokens=used, token_budget=budget)
        for wide, screen in ((True, 160), (False, 80)):
            widths = column_widths(wide, 7, screen)
            cells = dataset_cells(ds, live=True, stale=False, wide=wide)
            (width,) = [w for c, w in widths if c.key == "tokens"]
            (tokens,) = [t for (c, _w), t in zip(widths, cells, strict=True) if c.key == "tokens"]
            assert tokens.plain.endswith(display.budget(used, budget))
            assert tokens.cell_len <= width
            # Every column, with its padding, still fits the screen.
            assert sum(w + 2 for _c, w in widths) <= screen


def test_an_endpoint_line_writes_its_figures_with_the_display_module() -> None:
    em = EndpointMetrics(
        name="local-gpu",
        url="http://127.0.0.1:1/v1",
        available=True,
        engine="sglang",
        running=Quantity(value=1234),
        queued=Quantity(value=0),
        kv_usage=Quantity(value=0.254),
        gen_tok_per_s=Quantity(value=2160.4),
        files_tok_per_s=Quantity(value=1930.2),
        files_tok_per_s_err=290.0,
        ttft_p50_s=0.0042,
        ttft_p90_s=2.17,
    )
    line = endpoint_line(em).plain
    assert f"running {display.count(1234)}" in line and "queued 0" in line
    assert f"KV {display.percent(25.4)}" in line
    assert f"{display.rate(2160.4)} tok/s (server)" in line
    assert display.rate_pm(1930.2, 290.0, "tok/s (files)") in line
    assert f"TTFT p50 {display.latency(4.2)} p90 {display.latency(2170)}" in line


def test_an_endpoint_without_a_running_run_does_not_wait_for_responses() -> None:
    # "too few responses yet" is a promise; for an endpoint whose runs all stopped it is untrue.
    em = EndpointMetrics(name="api", url="https://api.example/v1", kind="api")
    assert "too few responses yet" in endpoint_line(em, writing=True).plain
    idle = endpoint_line(em, writing=False).plain
    assert "yet" not in idle and "no run writing" in idle


def test_the_events_panel_lists_the_newest_first() -> None:
    # The panel is clipped at its height; at 80 columns each event wraps to two or three lines,
    # and with the newest last it was the newest that did not show.
    events = [
        Event(
            kind="dataset-done",
            severity="info",
            host="laptop",
            title=f"api B{i}",
            message=f"done: {i}",
            key=f"k{i}",
            time=1_764_460_800.0 + i,
        )
        for i in range(1, 12)
    ]
    lines = events_text(events).plain.split("\n")
    assert "api B11" in lines[0]
    assert "api B4" in lines[-1]  # the last SHOWN (8) of them
    assert not any("api B3:" in line for line in lines)


def test_the_run_detail_notes_name_a_torn_last_line() -> None:
    from supervisor.engine import torn_tail_note
    from supervisor.model import RunView
    from tui.screens.run_detail import notes

    path = "/data/out/B2/raw_responses.jsonl"
    torn = DatasetView(name="B2", path=path, partial_tail_bytes=37)
    torn.torn_tail = torn_tail_note(path, 37)
    text = notes(RunView(name="gen", host="h", state="stopped", datasets=[torn])).plain
    assert "torn last line: 37 bytes" in text and "raw_responses.jsonl.broken" in text
    clean = DatasetView(name="B2", path=path, partial_tail_bytes=37)  # a writer is on it
    assert "torn" not in notes(RunView(name="gen", host="h", datasets=[clean])).plain
