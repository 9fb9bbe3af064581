//! The storage conformance suite on the redb backend.

concord_storage::storage_conformance_tests!(concord_storage::BackendKind::Redb);
concord_storage::persistence_conformance_tests!(concord_storage::BackendKind::Redb);
