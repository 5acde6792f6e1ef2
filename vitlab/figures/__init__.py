"""Figures: arrays in, plotly figures out (``plots``), and their PNG/SVG export (``static``). No computation."""
