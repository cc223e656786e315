"""One logging format for every service, so `.run/*.log` read alike."""

from __future__ import annotations

import logging


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
