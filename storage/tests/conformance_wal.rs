//! The storage conformance suite on the WAL backend (log in a WAL, state in redb).

concord_storage::storage_conformance_tests!(concord_storage::BackendKind::Wal);
concord_storage::persistence_conformance_tests!(concord_storage::BackendKind::Wal);
