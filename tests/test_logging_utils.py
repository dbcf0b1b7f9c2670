"""Progress reporting: plain lines in logs, a rich bar on a terminal; throughput and ETA after compiling."""


def test_progress_prints_lines_in_logs_and_a_rich_bar_on_a_terminal():
  import io
  from ncjax.logging_utils import Progress

  log = io.StringIO()
  p = Progress(30, 0, 64, every_steps=10, stream=log)
  for s in range(1, 31):
    p.update(s, {"loss": 1.0 / s})
  p.close()
  lines = log.getvalue().splitlines()
  assert [l.split("]")[1].split("|")[0].strip() for l in lines] == ["10/30", "20/30", "30/30"]
  assert "ex/s" in lines[-1] and "ETA" in lines[-1] and "loss 0.0333" in lines[-1]

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  term = Terminal()
  p = Progress(30, 0, 64, stream=term)
  for s in range(1, 31):
    p.update(s, {"loss": 1.0 / s})
  p.close()
  assert "30/30" in term.getvalue() and "\r" in term.getvalue() and "ex/s" in term.getvalue()


def test_demo_tables_are_markdown_laid_out_by_rich():
  from ncjax.cli import demo
  text = demo.format_region_table([dict(name="DisNCL", noise=0.4, i2t=63.5, t2i=53.5, rsum=488.5, auc=0.986,
                                        seconds=111),
                                   dict(name="SGRAF hinge (clean)", noise=0.0, i2t=77.0, t2i=53.5, rsum=493.8,
                                        auc=float("nan"), seconds=96)])
  lines = text.splitlines()
  assert lines[0].startswith("| method (region features)") and set(lines[1]) <= set("|-")
  assert "| DisNCL " in lines[2] and "488.5" in lines[2] and "0.986" in lines[2]
  assert lines[3].split("|")[6].strip() == "-"          # an undefined AUC shows as '-', never 'nan'
  assert len({len(l) for l in lines}) == 1               # columns aligned


def test_demo_prints_the_ncbench_table_its_legend_and_plots(tmp_path, monkeypatch, capsys):
  """`make demo`'s output path (the sweep itself is NC-bench's, tested in tests/cli/test_ncbench.py)."""
  from ncjax.cli import demo, ncbench
  records = [dict(method=m, noise=r, seed=0, noise_sha256="h", seconds=1.0, metrics={"zeroshot/acc1": v})
             for m, r, v in [("clip", 0.0, 0.95), ("clip", 0.4, 0.86), ("gsc", 0.4, 0.88),
                             ("ncu_gsc_forget", 0.4, 0.85)]]
  rows = ncbench.aggregate(records)
  fake = dict(records=records, rows=rows, table=ncbench.format_markdown(rows, "clip"), plots=["roc_noise0.4.png"])
  monkeypatch.setattr(demo, "RESULTS_DIR", str(tmp_path))
  monkeypatch.setattr(demo, "_setup_jax", lambda: __import__("jax"))
  monkeypatch.setattr(demo, "run_ncbench", lambda: fake)
  assert demo.main([]) == 0
  out = capsys.readouterr().out
  assert "recovered" in out and "22%" in out                     # (0.88 - 0.86) / (0.95 - 0.86)
  assert "forget set = lowest GSC soft labels" in out            # the legend names the composition
  assert "make demo-all" in out and "roc_noise0.4.png" in out
  assert "recovered" in (tmp_path / "results.md").read_text()
