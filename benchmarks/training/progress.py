"""A progress bar on stderr: tqdm when it is installed, else a one-line text bar."""
import sys
import time


class ProgressBar:
    def __init__(self, total: int, label: str):
        self.total, self.label, self.n, self.start = max(1, total), label, 0, time.perf_counter()
        try:
            from tqdm import tqdm
            self._tqdm = tqdm(total=total, desc=label, unit="step", file=sys.stderr, leave=True)
        except ImportError:
            self._tqdm = None
            self._draw()

    def update_to(self, n: int) -> None:
        n = min(n, self.total)
        if self._tqdm is not None:
            self._tqdm.update(n - self.n)
            self.n = n
            return
        self.n = n
        self._draw()

    def _draw(self) -> None:
        width = 30
        done = int(width * self.n / self.total)
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.label:<28} |{'#' * done}{'.' * (width - done)}| {self.n}/{self.total} steps "
                         f"{elapsed:5.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()
