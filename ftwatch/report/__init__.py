"""``ftwatch report``: a self-contained HTML page of what the store holds (SPEC E4).

``reader`` (where the data comes from: :class:`~ftwatch.report.reader.ReportReader`), ``model``
(the plotted series), ``render`` (Jinja2 page with the vendored Chart.js inlined).
"""
