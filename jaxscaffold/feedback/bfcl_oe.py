"""FEE's observation enhancement (OE) for BFCL, as the reference code does it: right after a
call, extra underscore-prefixed keys computed from the backend instance's state are added to
its dict result (and a `None` result of some classes becomes a success message first).

One table of rules per class (`OE_RULES`); a rule is (the methods it applies to, None for
all; a test on the result; a function giving the extra keys). Rules only read the instance.
`enrich_result` is a `jaxscaffold.envs.bfcl_calls.ResultTransform`: the env runs it where the
instances live (in its worker process), on the agent's calls and on the gold replay alike
(`BFCLEnv(oe_transform=...)`, wired by `feedback.enrichers.env_kwargs`), so enriched results
compare like with like; the enriched text reaches the agent only when the schedule turns OE on
(`feedback.enrichers.bfcl_oe`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class OERule(NamedTuple):
    methods: tuple[str, ...] | None  # None: every method of the class
    applies: Callable[[dict], bool]  # on the (dict) result
    extras: Callable[[Any, str, dict, dict], dict]  # (instance, method, kwargs, result) -> keys


SUCCESS_TEXT_FOR_NONE = ("GorillaFileSystem", "TradingBot")
FS_CHANGING = ("cd", "mkdir", "touch", "rm", "rmdir", "mv", "cp", "echo")
TRAVEL_TOKEN_METHODS = ("authenticate_travel", "register_credit_card", "get_credit_card_balance",
                        "book_flight", "retrieve_invoice", "cancel_booking", "set_budget_limit",
                        "purchase_insurance")
TRADING_TIME_SENSITIVE = ("get_current_time", "update_market_status", "place_order",
                          "make_transaction")
TRADING_HOURS = "09:30 AM - 04:00 PM"  # TradingBot.update_market_status's open window
STALE_PRICE_PCT = 5.0

IGNITION_HINT = ("To start the engine, lock all doors (lockDoors), press the brake pedal fully "
                 "(pressBrakePedal with pedalPosition=1.0) and make sure there is fuel "
                 "(fillFuelTank).")
TIRE_NOTE = ("healthy_tire_pressure means the average tire pressure is within the 30-35 psi "
             "factory range.")
LOGIN_HINT = "Log in first: call trading_login(username, password), then retry."
MARKET_CLOSED = (f"The market is closed (trading hours {TRADING_HOURS}); transactions are "
                 "refused until it opens.")
SECTOR_HINT = ("No stock matches. Browse the symbols of a sector with "
               "get_available_stocks(sector), e.g. sector='Technology' or 'Automobile'.")
ORDER_STATUS = {
    "Pending": "placed, not yet executed",
    "Open": "accepted by the market and waiting to be filled",
    "Completed": "executed; it can no longer be cancelled",
    "Cancelled": "cancelled; it will not be executed",
}
TOKEN_HINT = ("The access token is about to expire: call authenticate_travel again for a new "
              "one.")
TRAVELER_RULES = ("Traveler verification requires: age 18 or older, a passport number starting "
                  "with 'US', and the first and last name of the authenticated user.")
IATA_HINT = ("Airports are given by their 3-letter IATA codes: list_all_airports() lists them "
             "and get_nearest_airport_by_city(location) finds the one for a city.")


def _any(result: dict) -> bool:
    return True


def _failed(result: dict) -> bool:
    """A failure result: an `error` key, or a False `*_status` flag (TravelAPI's style)."""
    return "error" in result or any(k.endswith("_status") and v is False
                                    for k, v in result.items())


def _succeeded(result: dict) -> bool:
    return not _failed(result)


def _not_authenticated(result: dict) -> bool:
    return "not authenticated" in str(result.get("error", ""))


def _symbol_not_found(result: dict) -> bool:
    return result.get("symbol") == "Stock not found" or "not found" in str(result.get("error", ""))


def _fs_path(fs, method, kwargs, result) -> dict:
    return {"_current_path": fs.pwd()["current_working_directory"]}


def _fs_listing(fs, method, kwargs, result) -> dict:
    return {"_directory_contents": fs.ls()["current_directory_content"]}


def _ignition_diagnostic(car, method, kwargs, result) -> dict:
    unlocked = [door for door, state in car.doorStatus.items() if state != "locked"]
    return {"_ignition_diagnostic": {
        "all_doors_locked": not unlocked, "unlocked_doors": unlocked,
        # pressBrakePedal stores position * 1000 N; startEngine needs exactly 1000 N
        "brake_pedal_position": round(car._brakePedalForce / 1000.0, 3),
        "fuel_gallons": car.fuelLevel, "battery_voltage": car.batteryVoltage},
        "_ignition_hint": IGNITION_HINT}


def _tire_note(car, method, kwargs, result) -> dict:
    return {"_tire_pressure_note": TIRE_NOTE}


def _door_grid(car, method, kwargs, result) -> dict:
    return {"_door_status": dict(car.doorStatus),
            "_unlocked_doors": sum(state != "locked" for state in car.doorStatus.values())}


def _login_hint(bot, method, kwargs, result) -> dict:
    return {"_login_hint": LOGIN_HINT}


def _market_clock(bot, method, kwargs, result) -> dict:
    out = {"_system_time": bot.get_current_time()["current_time"],
           "_market_status": bot.market_status, "_trading_hours": TRADING_HOURS}
    if bot.market_status != "Open":
        out["_market_warning"] = MARKET_CLOSED
    return out


def _order_quote(bot, method, kwargs, result) -> dict:
    stock = bot.stocks.get(kwargs.get("symbol"))
    price, amount = result.get("price"), result.get("amount")
    if not stock or not isinstance(price, (int, float)) or not isinstance(amount, (int, float)):
        return {}
    market = stock["price"]
    if not market:
        return {}
    deviation = (price - market) / market * 100.0
    total = price * amount
    balance = bot.account_info.get("balance", 0.0)
    out = {"_market_price": market, "_price_deviation_pct": round(deviation, 2),
           "_stale_price": abs(deviation) > STALE_PRICE_PCT, "_total_cost": round(total, 2)}
    if str(result.get("order_type", "")).lower() == "buy":  # what is left once it fills
        out["_remaining_balance"] = round(balance - total, 2)
    return out


def _sector_hint(bot, method, kwargs, result) -> dict:
    return {"_lookup_hint": SECTOR_HINT}


def _order_status(bot, method, kwargs, result) -> dict:
    meaning = ORDER_STATUS.get(result.get("status"))
    return {"_status_meaning": meaning} if meaning else {}


def _token_budget(api, method, kwargs, result) -> dict:
    left = api.token_expires_in
    if left is None:
        return {}
    out = {"_token_calls_remaining": left}
    if left <= 1:
        out["_token_hint"] = TOKEN_HINT
    return out


def _traveler_rules(api, method, kwargs, result) -> dict:
    return {"_verification_rules": TRAVELER_RULES}


def _card_balances(api) -> dict:
    return {card: info["balance"] for card, info in api.credit_card_list.items()
            if isinstance(info, dict) and "balance" in info}


def _affordability(api, method, kwargs, result) -> dict:
    costs = result.get("travel_cost_list") or []
    key = "|".join(str(kwargs.get(k)) for k in ("travel_from", "travel_to", "travel_class",
                                                  "travel_date"))
    entry = api._flight_cost_lookup.get(key)  # long_context lists every route: pick this one
    cost = entry["cost"] if entry else (costs[0] if costs else None)
    if cost is None:
        return {}
    balances = _card_balances(api)
    best = max(balances, key=balances.get) if balances else None
    limit = api.budget_limit
    return {"_affordability": {
        "cost": cost, "best_card": best,
        "best_card_balance": balances[best] if best else None,
        "within_card_balance": best is not None and balances[best] >= cost,
        "budget_limit": limit, "within_budget": limit is None or cost <= limit}}


def _booking_help(api, method, kwargs, result) -> dict:
    error = str(result.get("error", ""))
    if "airport code" in error:
        return {"_booking_hint": IATA_HINT}
    if any(s in error for s in ("Insufficient funds", "budget limit", "Card not registered",
                                "Balance not found")):
        return {"_card_balances": _card_balances(api), "_budget_limit": api.budget_limit}
    return {}


OE_RULES: dict[str, tuple[OERule, ...]] = {
    "GorillaFileSystem": (
        OERule(None, _any, _fs_path),
        OERule(FS_CHANGING, _succeeded, _fs_listing),
    ),
    "VehicleControlAPI": (
        OERule(("startEngine",), _failed, _ignition_diagnostic),
        OERule(("check_tire_pressure",), _any, _tire_note),
        OERule(("lockDoors",), _any, _door_grid),
    ),
    "TradingBot": (
        OERule(None, _not_authenticated, _login_hint),
        OERule(TRADING_TIME_SENSITIVE, _any, _market_clock),
        OERule(("place_order",), _succeeded, _order_quote),
        OERule(("get_symbol_by_name", "get_stock_info"), _symbol_not_found, _sector_hint),
        OERule(("get_order_details",), _succeeded, _order_status),
    ),
    "TravelAPI": (
        OERule(TRAVEL_TOKEN_METHODS, _any, _token_budget),
        OERule(("verify_traveler_information",), _failed, _traveler_rules),
        OERule(("get_flight_cost",), _succeeded, _affordability),
        OERule(("book_flight",), _failed, _booking_help),
    ),
}


def enrich_result(instance: Any, method: str, kwargs: dict, result: Any) -> Any:
    """FEE's BFCL observation enhancement of one call's result (a `ResultTransform`).

    `result` is what the call returned (a copy) or the exception it raised; the instance is
    read right after the call. A `None` result of a `SUCCESS_TEXT_FOR_NONE` class becomes
    `{"observation": "Command '<method>' completed successfully."}`; a dict result gets the
    extra keys of every matching rule of `OE_RULES`; anything else is returned unchanged.
    """
    class_name = type(instance).__name__
    if result is None and class_name in SUCCESS_TEXT_FOR_NONE:
        result = {"observation": f"Command '{method}' completed successfully."}
    if not isinstance(result, dict):
        return result
    extras: dict = {}
    for rule in OE_RULES.get(class_name, ()):
        if (rule.methods is None or method in rule.methods) and rule.applies(result):
            extras.update(rule.extras(instance, method, kwargs, result))
    return {**result, **extras} if extras else result
