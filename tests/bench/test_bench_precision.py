"""bench.precision's table: ratios from the measured runs."""

from bench import precision


def run(name, batch, k, speed, rss, step, dtype=None):
  return dict(name=name, batch=batch, k=k, precision=dtype,
              examples_per_sec=speed, peak_rss_mb=rss, step_memory_mb=step)


def test_table_gives_memory_and_speed_ratios():
  # 100 / 400 MB step memory = 0.25x, 600 / 800 peak = 0.75x, 90 / 100
  # examples/sec = 0.90x; bfloat16 30 / float32 120 = 0.250x.
  text = precision.table([
      run("one batch", 1024, 1, 100.0, 800.0, 400.0),
      run("8 micro-batches", 128, 8, 90.0, 600.0, 100.0),
      run("float32", 128, 1, 120.0, 500.0, 90.0),
      run("bfloat16", 128, 1, 30.0, 510.0, 95.0, "bfloat16")])
  assert "| 8 micro-batches | 128 x 8 | 90 | 600 | 100 |" in text
  assert "0.25x (peak RSS 0.75x); speed 0.90x." in text
  assert "bfloat16 / float32 examples/sec at batch 128: 0.250x." in text
