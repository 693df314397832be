"""The names that tenants share a space with: ordering keys and provider keys are
injective (two tenants' names never meet), stable, and keep the identifier contract."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.schemas import KEY_MAX_LENGTH, check_identifier
from dispatcher.tenancy import (
    ORDERING_SEPARATOR,
    PROVIDER_SEPARATOR,
    key_to_store,
    ordering_key,
    provider_key,
    stored_provider_key,
)

tenants = st.text(min_size=1, max_size=40)
# The identifier contract: printable ASCII without "/".
names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/"),
    min_size=1,
    max_size=40,
)


def test_the_documented_forms() -> None:
    assert ordering_key("acme", "run-1") == "acme/run-1"
    assert ordering_key("a/b", "run-1") == "a%2Fb/run-1"
    assert ordering_key("a%2Fb", "run-1") == "a%252Fb/run-1"
    assert provider_key("acme", "refund:o-1:c-9") == "acme:refund:o-1:c-9"
    assert provider_key("a:b", "k") == "a%3Ab:k"
    assert provider_key("ünï cörn", "k") == "%C3%BCn%C3%AF%20c%C3%B6rn:k"
    assert provider_key("acme", "refund:o-1", namespaced=False) == "refund:o-1"


@given(tenants, names, tenants, names)
def test_two_tenants_names_never_share_an_ordering_key(
    tenant: str, name: str, other_tenant: str, other_name: str
) -> None:
    same = ordering_key(tenant, name) == ordering_key(other_tenant, other_name)
    assert same == ((tenant, name) == (other_tenant, other_name))
    # The first separator divides the tenant from the name.
    assert ordering_key(tenant, name).split(ORDERING_SEPARATOR, 1)[1] == name


@given(tenants, names, tenants, names)
def test_two_tenants_keys_never_share_a_provider_key(
    tenant: str, key: str, other_tenant: str, other_key: str
) -> None:
    same = provider_key(tenant, key) == provider_key(other_tenant, other_key)
    assert same == ((tenant, key) == (other_tenant, other_key))
    assert provider_key(tenant, key).split(PROVIDER_SEPARATOR, 1)[1] == key


@given(tenants, names)
def test_a_provider_key_keeps_the_identifier_contract(tenant: str, key: str) -> None:
    # It travels in a header and in lookup URLs, as the key it qualifies does.
    qualified = provider_key(tenant, key)
    assert check_identifier(qualified, KEY_MAX_LENGTH + 3 * 4 * 40 + 1) == qualified


@given(tenants, names, st.booleans())
def test_the_stored_provider_key_gives_back_the_key_intake_computed(
    tenant: str, key: str, namespaced: bool
) -> None:
    # A namespaced key is not stored (NULL) and is read back as the same key.
    stored = key_to_store(tenant, key, namespaced=namespaced)
    assert (stored is None) == namespaced
    assert stored_provider_key(tenant, key, stored) == provider_key(
        tenant, key, namespaced=namespaced
    )


def test_a_stored_provider_key_wins_over_the_namespaced_form() -> None:
    # A call from before the upgrade keeps the bare key it was first sent with.
    assert stored_provider_key("acme", "k-legacy", "k-legacy") == "k-legacy"
    assert stored_provider_key("acme", "k-1", None) == "acme:k-1"
