"""What HLO operations mean, on plain numpy values and attribute values: elementwise kernels
(:mod:`~tpusim.semantics.elementwise`), conversions and denormal flushing (:mod:`~tpusim.semantics.convert`),
reduction combiners and their identities (:mod:`~tpusim.semantics.combiners`), special functions
(:mod:`~tpusim.semantics.special`) and collective groups (:mod:`~tpusim.semantics.groups`).

It sits below both the reference interpreter (``tpusim.compiler.hlo.reference``) and the device model
(``tpusim.devices``), which compute with the same functions, and imports only ``tpusim.memory``: it knows no
HLO text, instruction or compiler (``tests/test_import_direction.py``).
"""
