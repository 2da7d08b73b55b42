"""The P/D path: the policy of one request's path (path.py) over every call to the pools (hops.py); see README.md."""
