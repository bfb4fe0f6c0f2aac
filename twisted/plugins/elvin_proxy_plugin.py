"""twistd plugin: ``twistd elvin-proxy`` runs an Elvin proxy (see elvin.proxy.tap)."""

from twisted.application.service import ServiceMaker

elvin_proxy = ServiceMaker(
    "Elvin proxy", "elvin.proxy.tap",
    "An Elvin proxy keeping sessions for sometimes-disconnected clients.", "elvin-proxy")
