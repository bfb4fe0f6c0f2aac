"""twistd plugin: ``twistd elvin`` runs an Elvin 4.0 router (see elvin.tap)."""

from twisted.application.service import ServiceMaker

elvin = ServiceMaker(
    "Elvin router", "elvin.tap", "An Elvin 4.0 content-based message router.", "elvin")
