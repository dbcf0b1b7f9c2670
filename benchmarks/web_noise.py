"""What the loss sees of injected noise on web data (issue 45), with the real order code and nothing read: NCR's
caption shuffle at ratio 0.4 over a mixture of two datasets (7M + 3M pairs), 4 processes, at 256 / 1,024 / 4,096
pairs per process, under the two indexed reads:

* per pair (`input.web.read=pair`, `noise.PermutedNoise` per dataset: `noise.DatasetNoise`): NCR's protocol over
  each dataset's ids, one ranged read per noisy pair's partner;
* in blocks (`input.web.read=block`, `noise.BlockNoise`): blocks paired across the dataset, partners from the other
  block of the pair, read with it, the window's deal keeping each noisy caption's own image out of its batch.

Per setting: the share of captions shown another pair's image (in the batches of one window, and exactly over the
data), the median distance in ids from a noisy caption to its partner (shard neighbours are close: 19 before this
change), and the share of noisy captions whose own image is in their global batch (shown with another caption: an
in-batch negative NCR's protocol all but never makes).

  .venv/bin/python -m benchmarks.web_noise          (about a minute; no data, no accelerator)
"""

from __future__ import annotations

import sys
import time

from benchmarks import common

SIZES = (7_000_000, 3_000_000)
PROCESSES = 4
RATIO = 0.4


def _fake_datasets(sizes):
  from ncjax.data.web import dataset as web
  return [web.WebDataset(f"/nowhere/{d}", [f"/nowhere/{d}/0.tar"], [n], index=object()) for d, n in enumerate(sizes)]


def statistics(read: str, per_process: int, windows: int = 1) -> dict:
  from ncjax.data.noise import PermutedNoise
  from ncjax.data.web import noise_deal, pipeline as web_pipeline
  n = sum(SIZES)
  data = web_pipeline.WebTrainData(_fake_datasets(SIZES), None, per_process * PROCESSES, 0, None, read=read,
                                   noise=PermutedNoise(n, RATIO, seed=1), process_index=0, process_count=PROCESSES)
  g, steps = data.steps_per_window, max(16, data.steps_per_window) * windows
  t = time.perf_counter()
  stats = noise_deal.block_noise_statistics(data, range(g, g + steps))   # from the second window: mid-epoch
  return dict(read=read, per_process=per_process, steps=steps, seconds=time.perf_counter() - t, **stats)


def run(quick: bool = False) -> dict:
  rows = [statistics(read, b) for b in ((256, 4096) if quick else (256, 1024, 4096)) for read in ("pair", "block")]
  payload = dict(sizes=list(SIZES), processes=PROCESSES, ratio=RATIO, rows=rows)
  common.write("web_noise", payload)
  common.report(f"Injected noise (ratio {RATIO}) as the loss sees it: {PROCESSES} processes, datasets of "
                f"{'+'.join(f'{s / 1e6:g}M' for s in SIZES)} pairs", rows,
                [("per_process", "pairs/process", ",d"), ("read", "read", "s"),
                 ("shown_another_image", "shown another image (batches)", ".4f"), ("exact", "exact (data)", ".4f"),
                 ("median_partner_distance", "median partner distance (ids)", ",.0f"),
                 ("own_image_in_batch", "own image in batch", ".4f"), ("pairs", "pairs seen", ",d")])
  return payload


if __name__ == "__main__":
  run(quick="--quick" in sys.argv)
