"""Fixes to the pinned moto, applied by hack/moto-venv.sh right after install.

Each fix replaces one exact piece of moto's source and fails loudly if that
piece is not there (a new moto release must be checked by hand, then the fix
dropped or updated).

route53 CREATE: moto 5.2.5 refuses a CREATE whose change is already in the
zone's journal if any record set sorts after the new name, because it looks the
name up with a list that starts at it instead of an exact match. A record set
deleted and then created again with the same values is refused for good, which
real Route53 accepts (upstream getmoto/moto#9105). The fix refuses a CREATE
exactly when a record set of that name, type and set identifier exists.
"""

import pathlib
import sys

import moto

ROUTE53 = (
    "route53/models.py",
    """            if value["Action"] == "CREATE" and value in the_zone.rr_changes:
                name = value["ResourceRecordSet"]["Name"] + "."
                _type = value["ResourceRecordSet"]["Type"]
                # check if the record exists or just in rr_changes (journal)
                all_records = list(
                    the_zone.get_record_sets(start_type=_type, start_name=name)
                )
                if all_records:
                    raise ResourceRecordAlreadyExists(name=name, _type=_type)
""",
    """            if value["Action"] == "CREATE":
                wanted = value["ResourceRecordSet"]
                name = wanted["Name"].rstrip(".") + "."
                _type = wanted["Type"]
                if any(
                    rrset.name.rstrip(".") + "." == name
                    and rrset.type == _type
                    and rrset.set_identifier == wanted.get("SetIdentifier")
                    for rrset in the_zone.rrsets
                ):
                    raise ResourceRecordAlreadyExists(name=name, _type=_type)
""",
)


def apply(relative, old, new):
    path = pathlib.Path(moto.__file__).parent / relative
    source = path.read_text()
    if source.count(old) != 1:
        sys.exit(f"moto fix for {relative} does not apply to moto {moto.__version__}")
    path.write_text(source.replace(old, new))


apply(*ROUTE53)
