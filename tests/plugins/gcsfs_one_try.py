"""A test plugin (`ncjax train --plugins=tests/plugins/gcsfs_one_try.py`): gcsfs tries each failing request once
instead of six times (~30 s of its own backoff), so that a test times what ncjax itself decides about a store's
failure (tests/train/test_web_changes.py). Nothing in ncjax is edited."""

import gcsfs.core
import gcsfs.retry

gcsfs.core.GCSFileSystem._request = gcsfs.retry.retry_request(retries=1)(   # noqa: SLF001
    gcsfs.core.GCSFileSystem._request.__wrapped__)
