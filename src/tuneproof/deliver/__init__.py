"""The deliverable (docs/PROTOCOL.md steps 4 and 7): an export bundle bound to its exact base model
(``identity``, ``bundle``, ``verify``, ``card``, ``limits``), the dossier (``dossier``, ``plots``)
and the rental plan (``plan``). Components only; the commands live in :mod:`tuneproof.recipes`.
"""
