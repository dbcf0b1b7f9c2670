"""Render a local HTML page to a PNG with Chromium's engine from a pip package (Qt for Python's WebEngine:
`pip install 'ncjax[browser]'`, what `make test-all` installs) — no root, no browser download. One page per process
(Qt allows one application per process):

    python tests/render_page.py PAGE.html OUT.png [WIDTH HEIGHT]

Prints a JSON line {"ok", "images": [[src, decoded], ...]} (decoded: the <img> loaded with a non-zero natural width).
"""

import json
import os
import sys


def render(page: str, png: str, size=(1300, 2200), settle_ms: int = 500) -> dict:
  os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
  # --no-sandbox: Chromium refuses to run as root with its sandbox (as the Debian package's test did)
  os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--disable-gpu --no-sandbox --force-color-profile=srgb")
  from PySide6.QtCore import QSize, Qt, QTimer, QUrl
  from PySide6.QtWebEngineWidgets import QWebEngineView
  from PySide6.QtWidgets import QApplication
  QApplication.setAttribute(Qt.AA_ShareOpenGLContexts)
  app = QApplication.instance() or QApplication([])
  view = QWebEngineView()
  view.resize(QSize(*size))
  out: dict = {}

  def shoot():
    out["saved"] = bool(view.grab().save(png))
    app.quit()

  def images(result):
    out["images"] = json.loads(result)
    QTimer.singleShot(settle_ms, shoot)

  def loaded(ok):
    out["ok"] = bool(ok)
    view.page().runJavaScript("JSON.stringify([...document.images].map(i => [i.getAttribute('src'), "
                              "i.complete && i.naturalWidth > 0]))", 0, images)

  view.loadFinished.connect(loaded)
  view.load(QUrl.fromLocalFile(os.path.abspath(page)))
  view.show()
  QTimer.singleShot(60000, app.quit)
  app.exec()
  return out


def available() -> bool:
  try:
    import PySide6.QtWebEngineWidgets  # noqa: F401
  except ImportError:
    return False
  return True


if __name__ == "__main__":
  width, height = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (1300, 2200)
  result = render(sys.argv[1], sys.argv[2], (width, height))
  print(json.dumps(result))
  sys.exit(0 if result.get("ok") and result.get("saved") else 1)
