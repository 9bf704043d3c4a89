"""The trivial replica class the benchmark starts: it does nothing, so start-up is all overhead."""


class Noop:
    pass
