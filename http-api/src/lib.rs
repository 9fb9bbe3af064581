//! The `concord` server's HTTP API. Not built yet: see the open product issue.
