//! The storage conformance suite on the WAL backend (log in a WAL, state in redb).

concord_engine::storage_conformance_tests!(concord_engine::BackendKind::Wal);
concord_engine::persistence_conformance_tests!(concord_engine::BackendKind::Wal);
