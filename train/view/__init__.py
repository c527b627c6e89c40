"""What a person sees of a run, read from its run directory alone: ``status``, the live view, the HTML report.

:mod:`.runview` reads a run directory into one typed model; :mod:`.status` prints where a run stands,
:mod:`.live` redraws it every second (``status --watch``) and :mod:`.html_report` writes the whole run as one
page. Presentation lives here only: nothing below this folder imports rich or matplotlib.
"""
