"""What tests share: rigs (a node, a scheduler, a Redis group), builders of
configs and records, pollers that wait on a condition with a bound, and
clients of the API. Test modules import from here, never from each other:
a test module is a list of cases, and this package is the code under them.
"""
