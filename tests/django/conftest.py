"""Django for the tests of this folder only: the settings are configured here, when this
folder is collected (no DJANGO_SETTINGS_MODULE; the rest of the suite never needs one,
and pytest-django stays idle for it)."""

from __future__ import annotations

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="stormguard-tests-only",
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes",
                        "django.contrib.sessions"],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "tests.django.urls.FakeUserMiddleware",
            "stormguard.integrations.django.RateLimitMiddleware",
        ],
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        ROOT_URLCONF="tests.django.urls",
        USE_TZ=True,
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        STORMGUARD={"rules": [{"name": "per-ip", "scope": "ip", "limit": 1000,
                               "window": 60}]},
    )
    django.setup()
