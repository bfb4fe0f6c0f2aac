"""Router discovery: multicast advertisements and DNS-SD."""
