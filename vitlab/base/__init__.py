"""The bottom layer: errors with fields, argument checks, atomic writes, temporary model modes, statistics and
intervals, provenance and where the shipped files live. Imports nothing from the layers above."""
